"""SFT proxy for the embedded default: train SFT only, then measure on oracle demonstrations of
validation questions the teacher-forced copy-token accuracy and turn exact match per kind of turn,
and (NEVAL > 0) greedy accuracy of real rollouts. See docs/embedded_default.md.

    TFDS=/tmp/tfds NEVAL=96 python benchmarks/sft_proxy.py TAG "sft.copy_every=4,sft.steps=2000"

Writes benchmarks/results/sft_proxy/TAG/result.json (and the run's SFT checkpoints there).
"""
import sys, time, json, os, logging, collections
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "configs"))
from synthetic_tiny import get_config
from matpo_jax.world_assets import prepare_world, question_from_record
from matpo_jax.agents.search_server import SearchServer
from matpo_jax.runtime import Runtime, build_model, make_mesh, make_toolbox, optimizer_config, step_config
from matpo_jax.sft import build_sft_sequences, tool_text, _step_bins
from matpo_jax.rl import packing, train_step as step_lib
from matpo_jax.data import loader as loader_lib
from matpo_jax.data.oracle import Oracle, default_prompts, Imperfection
from matpo_jax.rl_loop import model_state
tag, override = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
neval = int(os.environ.get("NEVAL", "32"))
cfg = get_config(override or None)
work = os.path.join(REPO, "benchmarks", "results", "sft_proxy", tag); os.makedirs(work, exist_ok=True)
out = {"tag": tag, "override": override}
t0 = time.time()
assets = prepare_world(cfg, os.environ.get("TFDS", "/tmp/matpo_tfds"))
mesh = make_mesh(cfg)
tok = assets.chat.tokenizer if hasattr(assets.chat, "tokenizer") else None
with SearchServer(assets.corpus_path) as server:
    rt = Runtime(cfg=cfg, workdir=work, mesh=mesh, assets=assets, chat=assets.chat,
                 toolbox=make_toolbox(cfg, server.url))
    seqs = build_sft_sequences(rt)
    lens = [len(s) for s in seqs]
    out["prep_s"] = time.time() - t0
    out["num_seqs"] = len(seqs); out["mean_len"] = float(np.mean(lens)); out["max_len"] = int(max(lens))
    out["trainable_frac"] = float(np.mean(np.concatenate([s.trainable for s in seqs])))
    print("prep", out, flush=True)
    model = build_model(cfg, mesh)
    import resource
    from matpo_jax.sft import run_sft
    from matpo_jax import metrics as metrics_lib
    from matpo_jax.sft_data import copy_token_mask
    max_len = int(cfg.rl.pack_len)
    c0 = time.process_time(); t1 = time.time()
    graphdef, state = run_sft(rt, model, metrics_lib.MetricsWriter(work, enabled=False))
    out["train_wall_s"] = time.time() - t1; out["train_cpu_s"] = time.process_time() - c0
    print("train", out["train_wall_s"], out["train_cpu_s"], flush=True)
    # teacher-forced turn exact match on validation demos
    src = loader_lib.open_source(assets.config, assets.data_dir)["validation"]
    recs = [loader_lib.decode_record(src[i]) for i in range(min(len(src), 64))]
    qs = [question_from_record(r) for r in recs]
    mc = int(cfg.tools.max_response_chars)
    oracle = Oracle(tool_text(rt.toolbox, "search", mc), tool_text(rt.toolbox, "open", mc),
                    role_prompts=default_prompts(int(cfg.rollout.report_max_chars)),
                    imperfection=Imperfection(), num_results=int(cfg.tools.num_results), seed=1, fact_style=str(cfg.data.fact_style))
    ms = model_state(state)
    @jax.jit
    def fwd(ms, toks):
        m = nnx.merge(graphdef, ms)
        return jnp.argmax(m(toks), -1)
    stats = collections.defaultdict(list)
    tokstats = collections.defaultdict(list)
    convs = []
    for q in qs:
        d = oracle.planner(q)
        if not d.solved: continue
        convs.append(("planner", q.num_hops, d.messages))
        for w in d.workers: convs.append(("worker", q.num_hops, w.messages))
    L = max_len
    for i in range(0, len(convs), 8):
        chunk = convs[i:i+8]
        rend = [rt.chat.render(m) for _, _, m in chunk]
        toks = np.zeros((8, L), np.int32)
        for j, (ids, tr) in enumerate(rend): toks[j, :min(L, len(ids))] = ids[:L]
        pred = np.asarray(fwd(ms, jnp.asarray(toks)))
        for j, (ids, tr) in enumerate(rend):
            role, hops, msgs = chunk[j]
            ids = np.asarray(ids[:L]); tr = np.asarray(tr[:L])
            ends = np.flatnonzero(ids == rt.chat.im_end_id)
            cm = copy_token_mask(ids, tr, int(ends[0]) + 1)
            p = np.zeros(len(ids), bool); p[1:] = pred[j, :len(ids)-1] == ids[1:]
            tokstats["COPY"].extend(p[cm].tolist()); tokstats["NONCOPY"].extend(p[tr & ~cm].tolist())
            # runs of trainable tokens = assistant turns
            runs, s = [], None
            for k in range(len(tr)):
                if tr[k] and s is None: s = k
                if (not tr[k]) and s is not None: runs.append((s, k)); s = None
            if s is not None: runs.append((s, len(tr)))
            turns = [m["content"] for m in msgs if m["role"] == "assistant"]
            for (a, b), text in zip(runs, turns):
                hit = pred[j, a-1:b-1] == ids[a:b]
                ok = bool(np.all(hit))
                if role == "planner":
                    kind = "p_answer" if "boxed" in text else "p_subtask"
                else:
                    kind = ("w_search" if '"search"' in text else "w_open" if '"open"' in text
                            else "w_report" if text.startswith("Conclusion") else "w_fact")
                stats[kind].append(ok)
                tokstats[kind].extend(hit.tolist())
                if role == "planner" and kind == "p_answer": tokstats[f"p_answer_h{hops}"].extend(hit.tolist())
                if role == "planner" and kind == "p_answer": stats[f"p_answer_h{hops}"].append(ok)
    out["tok"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(tokstats.items())}
    print("tok", out["tok"], flush=True)
    out["tf"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(stats.items())}
    print("teacher-forced", out["tf"], flush=True)
    if neval > 0:
        from matpo_jax.evaluate import evaluate
        cfg.eval.num_questions = neval
        t2 = time.time()
        ev = evaluate(rt, graphdef, ms, tag="greedy")
        out["eval_s"] = time.time() - t2
        out["eval"] = {k: round(v, 3) for k, v in ev.items() if "accuracy" in k or k in ("eval/answered", "eval/tool_calls_per_question")}
        print("eval", out["eval"], flush=True)
json.dump(out, open(f"{work}/result.json", "w"), indent=1)
print("RESULT", json.dumps(out))
