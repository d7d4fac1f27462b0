#!/usr/bin/env bash
# Starts training on every worker at once, after copying the secrets and checking the services.
#
#   launch/run.sh --accelerator=v5e-64 --env_file=secrets.env CONFIG WORKDIR [TRAIN_FLAG ...]
#   e.g. launch/run.sh --env_file="$HOME/matpo.env" configs/qwen3_4b_musique.py gs://bucket/run1 \
#          --config.rollout.decode_slots=256
#
# 1. Every worker must hold the commit --commit names (default: local HEAD; setup.sh put it there).
# 2. Secrets: the env file (KEY=value lines: SERPER_API_KEY, OPENAI_API_KEY, HF_TOKEN...) must be
#    readable by you only (chmod 600). It is copied into ~/SECRETS_DIR (mode 700) on every worker,
#    made mode 600 there, and sourced by the remote shell; no value is ever on a command line.
# 3. --page_reader=CMD (or PAGE_READER_CMD) starts a page-reader service on every worker first
#    (with the secrets in its environment; log in REMOTE_DIR/logs/page_reader.log).
# 4. launch/check_services.py probes the search, page reader and judge the config needs, on every
#    worker; training starts only when all answer (--skip_checks skips this).
# 5. Training runs detached on every worker (python -m matpo_jax.train --multihost), appending to
#    REMOTE_DIR/logs/train.log; a training still running from an earlier run.sh is stopped first.
#    Rerunning the same command resumes from the newest checkpoint in WORKDIR (a gs:// bucket for
#    pods: the VMs' disks do not survive preemption). Collect the logs with launch/logs.sh.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

ENV_FILE=${ENV_FILE:-}
PAGE_READER_CMD=${PAGE_READER_CMD:-}
COMMIT=HEAD
ARGS=()
CHECKS=1
WAIT_S=120
for arg in "$@"; do
  case $arg in
    --env_file=*) ENV_FILE=${arg#*=} ;;
    --page_reader=*) PAGE_READER_CMD=${arg#*=} ;;
    --commit=*) COMMIT=${arg#*=} ;;
    --skip_checks) CHECKS=0 ;;
    --wait_s=*) WAIT_S=${arg#*=} ;;
    -h | --help)
      sed -n '2,21p' "$0"
      echo "  --env_file=FILE        secrets, KEY=value lines [ENV_FILE]"
      echo "  --page_reader=CMD      page-reader service started on every worker [PAGE_READER_CMD]"
      echo "  --commit=REV           the commit every worker must hold (default HEAD)"
      echo "  --wait_s=S             how long the checks wait for a service to come up (default 120)"
      echo "  --skip_checks          start training without checking the services"
      usage_common
      exit 0 ;;
    *)
      if ! common_flag "$arg"; then
        if ((${#ARGS[@]} < 2)); then  # before CONFIG WORKDIR: a launch flag, else a typo
          [[ $arg != -* ]] || unknown_flag "$arg"
        else
          check_train_flag "$arg"
        fi
        ARGS+=("$arg")
      fi ;;
  esac
done
resolve_settings
((${#ARGS[@]} >= 2)) || die "usage: launch/run.sh [flags] CONFIG WORKDIR [TRAIN_FLAG ...] (see --help)"
CONFIG=${ARGS[0]}
WORKDIR=${ARGS[1]}
TRAIN_FLAGS=(${ARGS[@]+"${ARGS[@]:2}"})
[[ -f $REPO_ROOT/${CONFIG%%:*} ]] || die "config file ${CONFIG%%:*} is not in $REPO_ROOT (CONFIG is relative to the repository root)"
[[ $WORKDIR == gs://* ]] || echo "warning: WORKDIR $WORKDIR is not a gs:// bucket: checkpoints on a worker's disk are lost with the VM" >&2
[[ $WAIT_S =~ ^[0-9]+$ ]] || die "--wait_s=$WAIT_S: expected whole seconds"
SHA=$(git -C "$REPO_ROOT" rev-parse --verify "$COMMIT^{commit}") || die "--commit=$COMMIT is not a commit"

ENV_FILE=${ENV_FILE/#\~/$HOME}
if [[ -n $ENV_FILE ]]; then
  [[ -f $ENV_FILE ]] || die "--env_file=$ENV_FILE does not exist"
  [[ -z $(find "$ENV_FILE" -perm -004 -o -perm -040) ]] ||
    die "--env_file=$ENV_FILE is readable by others: chmod 600 $ENV_FILE"
fi

dir=$(q "$REMOTE_DIR")
secrets="\"\$HOME/$SECRETS_DIR\""
# Every remote step that runs project code starts here: the right folder, the right commit.
prelude="set -euo pipefail
cd $dir
mkdir -p logs
[ \"\$(cat COMMIT 2>/dev/null)\" = $SHA ] || { echo \"\$(hostname): holds commit \$(cat COMMIT 2>/dev/null || echo none), expected $SHA: run launch/setup.sh\" >&2; exit 1; }"
if [[ -n $ENV_FILE ]]; then
  prelude+="
$(source_secrets)"
fi

# The secrets: a private folder, the file copied into it, then mode 600.
if [[ -n $ENV_FILE ]]; then
  ssh_all "set -euo pipefail
mkdir -p -m 700 $secrets
chmod 700 $secrets
rm -f $secrets/env
(umask 077 && : > $secrets/env)"
  run gcloud compute tpus tpu-vm scp "$ENV_FILE" "$TPU_NAME:$SECRETS_DIR/env" "${LOCATION[@]}" --worker=all
  ssh_all "chmod 600 $secrets/env"
fi

# Stops the process a pid file names (started by an earlier run.sh on this worker), if alive.
stop_recorded() {
  printf '%s' "if [ -f logs/$1.pid ] && kill -0 \"\$(cat logs/$1.pid)\" 2>/dev/null; then kill \"\$(cat logs/$1.pid)\"; sleep 10; fi"
}

if [[ -n $PAGE_READER_CMD ]]; then
  ssh_all "$prelude
$(stop_recorded page_reader)
setsid nohup bash -c $(q "$PAGE_READER_CMD") >> logs/page_reader.log 2>&1 < /dev/null &
echo \$! > logs/page_reader.pid"
fi

config_flags=(--config="$CONFIG")
for flag in ${TRAIN_FLAGS[@]+"${TRAIN_FLAGS[@]}"}; do
  if [[ $flag == --config.* ]]; then
    config_flags+=("$flag")
  fi
done
if [[ $CHECKS == 1 ]]; then
  ssh_all "$prelude
.venv/bin/python launch/check_services.py $(printf '%q ' "${config_flags[@]}")--wait_s=$WAIT_S 2>&1 | tee logs/check_services.log"
fi

train=(.venv/bin/python -m matpo_jax.train --config="$CONFIG" --workdir="$WORKDIR" --multihost
  ${TRAIN_FLAGS[@]+"${TRAIN_FLAGS[@]}"})
ssh_all "$prelude
$(stop_recorded train)
echo \"== \$(date -u +%FT%TZ) start: commit $SHA, resumes from $(q "$WORKDIR") if it holds a checkpoint\" >> logs/train.log
setsid nohup $(printf '%q ' "${train[@]}")>> logs/train.log 2>&1 < /dev/null &
echo \$! > logs/train.pid"

cat >&2 <<EOF
started on $NUM_WORKERS workers of $TPU_NAME.
  follow worker 0: gcloud compute tpus tpu-vm ssh $TPU_NAME $(location_text) --worker=0 --command='tail -f $REMOTE_DIR/logs/train.log'
  collect logs:    launch/logs.sh --name=$TPU_NAME --accelerator=$ACCELERATOR $(location_text)
  after a preemption: launch/resume.sh with the same flags and arguments
EOF
