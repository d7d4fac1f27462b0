"""The combined markdown table of every committed plan (benchmarks/results/plan_*.json)."""
from __future__ import annotations

import json
from pathlib import Path


def _gib(x) -> str:
    return f"{x / 2**30:.2f}"


def _fit(flag) -> str:
    return "yes" if flag else "**no**"


def _attention(plan: dict) -> str:
    """What the train step's packed attention ran (plans made before the plan recorded it were
    compiled with xla: `auto` then resolved for the CPU host), and the decode step's kernel when
    it ran one."""
    parts = []
    ts, ds = plan.get("train_step"), plan.get("decode_step")
    if ts:
        train = ts.get("attention", {}).get("train", "xla (not recorded)")
        parts.append(train + (" (shared prompts)" if ts.get("shared_prompts") else ""))
    decode = (ds or {}).get("attention", {}).get("decode", "xla")
    if not decode.startswith("xla"):
        parts.append(f"decode {decode}")
    return ", ".join(parts)


def _row(plan: dict, ts: dict | None, ds: dict | None, label: str) -> str:
    mesh = plan["mesh"]
    row = [label, plan["topology"], f"{mesh['data']}, {mesh['fsdp']}, {mesh['tensor']}"]
    if ts:
        m = ts["memory_per_chip"]
        row += [f"{ts['rows']} x {ts['row_length']}, {ts['micro_batches']} micro ({ts['remat']})",
                _gib(m["parameters"]), _gib(m["optimizer_state"]), _gib(m["gradients"]),
                _gib(m["activations_and_other_temporaries"]), _gib(m["peak"]),
                _fit(ts["fits"]), f"{ts['model_flops'] / 1e12:,.0f}",
                f"{ts['step_time_s_at_mfu']:.1f} @ {plan['mfu']:.0%}"]
    else:
        row += ["-"] + [""] * 8
    if ds:
        m = ds["memory_per_chip"]
        row += [f"{ds['slots']} x {ds['max_context']}{_paged(ds)}", _gib(m["kv_cache"]),
                _gib(ds["peak_with_optimizer_state"]), _fit(ds["fits"]),
                str(ds["slots_that_fit"])]
    else:
        row += ["-", "", "", "", ""]
    row.append(_gib(plan["hbm_per_chip"]))
    check = plan.get("train_fit_check")
    row.append("" if check is None or label.startswith("...") else
               "passes" if check["passes"] else "**refuses**")
    row.append("" if label.startswith("...") else _attention(plan))
    return "| " + " | ".join(row) + " |"


def _paged(ds: dict) -> str:
    """", paged (mean N tokens a slot)" for a paged KV cache's decode step, else ""."""
    if ds.get("kv_cache") != "paged":
        return ""
    return f", paged, a mean {ds['kv_mean_tokens_per_slot']:,.0f} tokens a slot"


def _compile_times(plan: dict) -> str:
    """Every compile of the plan, in order, and the whole command's wall time."""
    parts = []
    if "train_step" in plan:
        parts.append(f"train step {plan['train_step']['compile_s']} s")
    parts += [f"{t['micro_batches']} micro-batches {t['compile_s']} s"
              for t in plan.get("micro_batches_tried", [])]
    if "decode_step" in plan:
        parts.append(f"decode step {plan['decode_step']['compile_s']} s")
    parts += [f"{t['slots']} slots {t['compile_s']} s" for t in plan.get("decode_slots_tried", [])]
    if "wall_s" in plan:
        parts.append(f"{plan['wall_s'] / 60:.1f} min in all")
    return ", ".join(parts)


def memory_table(plans: list[dict]) -> list[str]:
    """The short per-chip table (the README's): the configured shapes, whether each phase fits,
    and what the plan found that fits."""
    lines = ["| config | slice (chips) | mesh d, f, t | parameters | optimizer state | "
             "activations + temp. | KV cache | train step fits | rollouts fit | decode slots "
             "that fit | step s @ MFU | `train`'s check | attention |",
             "|" + "---|" * 13]
    for plan in plans:
        ts, ds = plan.get("train_step"), plan.get("decode_step")
        mesh = plan["mesh"]
        row = [plan.get("config", "?").replace(".py", ""), f"{plan['topology']} ({plan['chips']})",
               f"{mesh['data']}, {mesh['fsdp']}, {mesh['tensor']}"]
        memory = (ts or ds or {}).get("memory_per_chip", {})
        row += [_gib(memory["parameters"]) if memory else "",
                _gib(ts["memory_per_chip"]["optimizer_state"]) if ts else "",
                _gib(ts["memory_per_chip"]["activations_and_other_temporaries"]) if ts
                else "not compiled",
                f"{_gib(ds['memory_per_chip']['kv_cache'])} ({ds['slots']} slots{_paged(ds)})"
                if ds
                else "not compiled"]
        fitting = plan.get("train_step_fitting")
        row.append("" if not ts else "yes" if ts["fits"] else
                   f"**no**; yes with {fitting['micro_batches']} micro-batches "
                   f"({_gib(fitting['memory_per_chip']['peak'])} peak)" if fitting else
                   f"**no** ({_gib(ts['memory_per_chip']['peak'])} peak)")
        row.append("" if not ds else "yes" if ds["fits"] else
                   f"**no** ({_gib(ds['peak_with_optimizer_state'])} with the optimizer state)")
        best = plan.get("decode_step_fitting_slots")
        row.append(f"{ds['slots']} as configured (~{ds['slots_that_fit']} estimated)"
                   if ds and ds["fits"] else
                   f"{best['slots']} (compiled)" if best else "")
        row.append(f"{ts['step_time_s_at_mfu']:.1f} @ {plan['mfu']:.0%}" if ts else "")
        check = plan.get("train_fit_check")
        row.append("" if check is None else "passes" if check["passes"] else
                   f"refuses ({check['slots_that_fit']} slots fit)")
        row.append(_attention(plan))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _train_cost(ts: dict) -> str:
    """XLA's per-chip FLOPs and bytes of a train step (older plans recorded the FLOPs only)."""
    cost = ts.get("cost_analysis_per_chip_loop_bodies_once")
    if cost:
        return f"{cost['flops'] / 1e12:.1f}, {cost['bytes_accessed'] / 1e9:.0f}"
    flops = ts.get("xla_flops_per_chip_loop_bodies_once")
    if flops:
        return f"{flops / 1e12:.1f}, -"
    return "not compiled" if not ts["memory_per_chip"]["compiled"] else "-"


def kernel_comparison(plans: list[dict]) -> list[str]:
    """Each plan whose packed attention ran a kernel beside the plan of the same config and
    topology that ran xla: the train step's per-chip memory before and after."""
    def key(plan):
        return plan.get("config"), plan["topology"], tuple(plan["mesh"].values())

    before = {key(p): p for p in plans if _attention(p).startswith("xla")}
    lines = []
    for after in plans:
        xla = before.get(key(after))
        if xla is None or _attention(after).startswith("xla") or not _attention(after):
            continue
        if not lines:
            lines = ["| config | topology | attention | activations + temp. | train peak "
                     "| fits | XLA cost analysis per chip, train step (loop bodies once): "
                     "TFLOPs, GB accessed |", "|" + "---|" * 7]
        cells = []
        for column in ("activations_and_other_temporaries", "peak"):
            cells.append(" -> ".join(_gib(p["train_step"]["memory_per_chip"][column])
                                     for p in (xla, after)))
        lines.append("| " + " | ".join([
            after.get("config", "?"), after["topology"],
            f"{_attention(xla)} -> {_attention(after)}", *cells,
            " -> ".join(_fit(p["train_step"]["fits"]) for p in (xla, after)),
            " -> ".join(_train_cost(p["train_step"]) for p in (xla, after))]) + " |")
    return lines


def decode_estimates(plans: list[dict]) -> list[str]:
    """The decode steps' times estimated from XLA's cost analysis, where a plan has them."""
    lines = []
    for plan in plans:
        for name in ("decode_step", "decode_step_fitting_slots"):
            ds = plan.get(name)
            if ds and "step_time_s_estimate_cost_analysis" in ds:
                cost = ds["cost_analysis_per_chip"]
                lines.append(
                    f"- {plan.get('config', '?')} on {plan['topology']}, {ds['slots']} slots x "
                    f"{ds['max_context']}: ~{ds['step_time_s_estimate_cost_analysis'] * 1e3:.1f} "
                    f"ms per decode step ({cost['flops'] / 1e12:.2f} TFLOPs and "
                    f"{cost['bytes_accessed'] / 1e9:.1f} GB accessed per chip)")
    return lines


def markdown(plans: list[dict]) -> str:
    lines = [
        "# Memory and FLOPs plans (compiled ahead of time for the TPU topology)", "",
        "Per chip, GiB (the README's table):", "", *memory_table(plans), "",
        "In full:", "",
        "Per chip, GiB. Train step: the real jitted `make_train_step` (RL objective, AdamW) "
        "compiled by libtpu for the topology from abstract shapes; parameters / optimizer state "
        "/ batch from the shardings, temporaries = compiled peak - live arguments and outputs "
        "(they hold the gradient accumulator, listed apart, and the activations). Decode step: "
        "one sampler step over every slot (`CausalLM.decode`); its peak plus the "
        "optimizer state (resident during rollouts) against HBM. Step time = model FLOPs / "
        "(chips x peak bf16 FLOP/s x MFU). `train`'s check: what `python -m matpo_jax.train` "
        "decides before any work from parameters + optimizer state + gradients and parameters "
        "+ optimizer state + KV cache per chip (planning/fit.py, no activations). Attention: "
        "what the train step's packed attention ran (`model.attention.train`, `auto` resolved "
        "for the topology's platform; docs/attention_kernels.md).", "",
        "| config | topology | mesh (data, fsdp, tensor) | rows x tokens (remat) | parameters | "
        "optimizer state | gradients | activations + other temp. | train peak | fits | "
        "TFLOPs / step | step s @ MFU | slots x context | KV cache | decode peak + opt. | fits "
        "| slots that fit | HBM | `train`'s check | attention |",
        "|" + "---|" * 20]
    for plan in plans:
        lines.append(_row(plan, plan.get("train_step"), plan.get("decode_step"),
                          plan.get("config", "?")))
        ts, ds = plan.get("train_step_fitting"), plan.get("decode_step_fitting_slots")
        if ts or ds:  # what the plan found that fits, when the configured shapes do not
            lines.append(_row(plan, ts, ds, "... what fits"))
    comparison = kernel_comparison(plans)
    if comparison:
        lines += ["", "Attention kernels, before -> after (per chip, GiB; the same config, "
                  "topology and batch, the train step compiled with xla and with the kernel "
                  "`auto` now resolves to on the TPU; plans without a recorded attention were "
                  "made before `auto` resolved for the TPU, and `--config.model.attention.train="
                  "xla` makes them again). The cost-analysis columns are XLA's "
                  "estimates of the compiled per-chip program, not measurements: a while loop's "
                  "body (the layer scan) is counted once and a Mosaic kernel declares no cost, "
                  "so they are no step time:", "", *comparison]
    estimates = decode_estimates(plans)
    if estimates:
        lines += ["", "Decode step times estimated from XLA's cost analysis (no TPU has run "
                  "them; the slower of FLOPs at peak and bytes at HBM bandwidth). XLA's bytes "
                  "accessed sum each operation's operands and outputs, so an array that several "
                  "operations read or update in place (the KV cache) counts more than once: "
                  "these sit well above the HBM floor of reading the parameters and the cache "
                  "once (the plan's `>=` figure):", "",
                  *estimates]
    lines += ["", "Commands and compile times (wall clock, on a 2-core machine shared with other "
              "work while they ran):", ""]
    for plan in plans:
        lines.append(f"- `{plan.get('command', '')}` (attention {_attention(plan) or '-'}): "
                     f"{_compile_times(plan)}; {plan.get('machine', '')}")
    notes = [f"{p.get('config', '?')} on {p['topology']}: {p['note']}" for p in plans
             if p.get("note")]
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def write_markdown(results_dir: str | Path, name: str = "plan.md") -> Path:
    results_dir = Path(results_dir)
    plans = [json.loads(p.read_text()) for p in sorted(results_dir.glob("plan_*.json"))]
    plans.sort(key=lambda p: (p["model"]["parameters"], p["topology"], p.get("config", "")))
    out = results_dir / name
    out.write_text(markdown(plans))
    return out
