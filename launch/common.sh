# shellcheck shell=bash
# Shared by the TPU launch scripts: settings, flag parsing, and one way to run a command.
#
# Settings come from flags (--name=..., see usage_common) or the environment (TPU_NAME=...);
# flags win. --dry_run prints every command (gcloud, git, mkdir) instead of running it, one per
# line, quoted as bash's printf %q does, so the output can be pasted into a shell.
# Arrays that may be empty expand as ${a[@]+"${a[@]}"}: bash 3.2 (macOS) with set -u rejects
# "${a[@]}" of an empty array.

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LAUNCH_DIR/.." && pwd)

TPU_NAME=${TPU_NAME:-matpo}
ACCELERATOR=${ACCELERATOR:-v5e-64}
ZONE=${ZONE:-}
PROJECT=${PROJECT:-}
RUNTIME_VERSION=${RUNTIME_VERSION:-}
NUM_WORKERS=${NUM_WORKERS:-}
REMOTE_DIR=${REMOTE_DIR:-matpo_jax}   # on every worker, relative to the home directory
SECRETS_DIR=${SECRETS_DIR:-.matpo_secrets}  # on every worker: mode 700, holds the env file
LOG_DIR=${LOG_DIR:-}                  # local folder for collected logs (default logs/TPU_NAME)
DRY_RUN=${DRY_RUN:-0}

usage_common() {
  cat <<'EOF'
Common flags (or the environment variable in brackets):
  --name=NAME            TPU VM / queued-resource node name [TPU_NAME, default matpo]
  --accelerator=TYPE     v5e-64, v5litepod-64, v5p-128, v6e-16, v4-32... [ACCELERATOR, default v5e-64]
  --zone=ZONE            default by family: v5e us-west4-a, v5p us-east5-a, v6e us-east5-b, v4 us-central2-b [ZONE]
  --project=PROJECT      default: gcloud's configured project [PROJECT]
  --version=RUNTIME      TPU software version, default by family [RUNTIME_VERSION]
  --workers=N            hosts in the slice, default from the accelerator type [NUM_WORKERS]
  --remote_dir=DIR       project folder on every worker [REMOTE_DIR, default matpo_jax]
  --log_dir=DIR          local folder for collected logs [LOG_DIR, default logs/NAME]
  --dry_run              print every command instead of running it [DRY_RUN=1]
EOF
}

die() {
  echo "error: $*" >&2
  exit 1
}

# Consumes one common flag; returns 1 when the argument is not one (the script handles it).
common_flag() {
  case $1 in
    --name=*) TPU_NAME=${1#*=} ;;
    --accelerator=*) ACCELERATOR=${1#*=} ;;
    --zone=*) ZONE=${1#*=} ;;
    --project=*) PROJECT=${1#*=} ;;
    --version=*) RUNTIME_VERSION=${1#*=} ;;
    --workers=*) NUM_WORKERS=${1#*=} ;;
    --remote_dir=*) REMOTE_DIR=${1#*=} ;;
    --log_dir=*) LOG_DIR=${1#*=} ;;
    --dry_run) DRY_RUN=1 ;;
    *) return 1 ;;
  esac
}

# Every flag of the launch scripts, spelled as they read it: a flag after CONFIG WORKDIR goes to
# train, so one of these there (or one spelled with dashes) is a misplaced or misspelt launch flag.
LAUNCH_FLAGS=(name accelerator zone project version workers remote_dir log_dir dry_run mode spot
  no_wait commit repo_url python skip_device_check env_file page_reader skip_checks wait_s skip_logs)

# Refuses (before anything runs) an argument before CONFIG WORKDIR that no script reads.
unknown_flag() {
  die "unknown flag '$1' before CONFIG WORKDIR (see --help); train's own flags go after them"
}

# Refuses a train flag (after CONFIG WORKDIR) that is a launch flag misplaced or misspelt: train
# would get it on the workers, detached, and the launch step it names would silently not happen.
check_train_flag() {
  local name=${1%%=*}
  [[ $name == --* ]] || return 0  # a value (--config.a.b VALUE)
  name=${name#--}
  local spelled=${name//-/_} flag
  for flag in "${LAUNCH_FLAGS[@]}"; do
    [[ $spelled != "$flag" ]] ||
      die "'$1' is a launch flag (--$spelled), but after CONFIG WORKDIR every flag goes to train: put it before CONFIG"
  done
  [[ $name != *-* ]] || die "'$1': train's flags are spelled with underscores (--$spelled)"
}

# The location flags as a follow-up command line needs them (zone, and project when set).
location_text() {
  printf '%s' "--zone=$ZONE${PROJECT:+ --project=$PROJECT}"
}

# Fills in what the flags left open: the gcloud accelerator name, zone, runtime and worker count.
resolve_settings() {
  local family size
  case $ACCELERATOR in
    v5e-*) ACCELERATOR_TYPE=v5litepod-${ACCELERATOR#v5e-} ;;
    *) ACCELERATOR_TYPE=$ACCELERATOR ;;
  esac
  family=${ACCELERATOR_TYPE%-*}
  size=${ACCELERATOR_TYPE##*-}
  [[ $size =~ ^[1-9][0-9]*$ ]] || die "--accelerator=$ACCELERATOR: expected FAMILY-SIZE with a size of at least 1, e.g. v5e-64 or v5p-128"
  local default_zone default_version workers
  case $family in
    # v5e and v6e count chips; single-host up to 8 chips, then 4 chips per host.
    v5litepod) default_zone=us-west4-a; default_version=v2-alpha-tpuv5-lite
      workers=$(( size <= 8 ? 1 : size / 4 )) ;;
    v6e) default_zone=us-east5-b; default_version=v2-alpha-tpuv6e
      workers=$(( size <= 8 ? 1 : size / 4 )) ;;
    # v5p and v4 count TensorCores: 2 per chip, 4 chips per host.
    v5p) default_zone=us-east5-a; default_version=v2-alpha-tpuv5
      workers=$(( size <= 8 ? 1 : size / 8 )) ;;
    v4) default_zone=us-central2-b; default_version=tpu-ubuntu2204-base
      workers=$(( size <= 8 ? 1 : size / 8 )) ;;
    *) die "--accelerator=$ACCELERATOR: unknown family '$family' (v5e/v5litepod, v5p, v6e, v4)" ;;
  esac
  ZONE=${ZONE:-$default_zone}
  RUNTIME_VERSION=${RUNTIME_VERSION:-$default_version}
  NUM_WORKERS=${NUM_WORKERS:-$workers}
  [[ $NUM_WORKERS =~ ^[1-9][0-9]*$ ]] || die "--workers=$NUM_WORKERS: expected a positive integer"
  LOG_DIR=${LOG_DIR:-$REPO_ROOT/logs/$TPU_NAME}
  [[ $TPU_NAME =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
    die "--name=$TPU_NAME: lowercase letters, digits and dashes, starting with a letter"
  LOCATION=(--zone="$ZONE")
  if [[ -n $PROJECT ]]; then
    LOCATION+=(--project="$PROJECT")
  fi
}

# Runs a command, or prints it (shell-quoted, one line) under --dry_run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    local quoted
    printf -v quoted '%q ' "$@"
    echo "${quoted% }"
  else
    "$@"
  fi
}

# One shell command on every worker of the slice at once (multi-host JAX needs all of them).
ssh_all() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOCATION[@]}" --worker=all --command="$1"
}

# One shell command on one worker.
ssh_one() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOCATION[@]}" --worker="$1" --command="$2"
}

# The remote shell prelude of every command that needs the secrets: export every variable of the
# env file (copied by run.sh, readable by its owner only). The values never appear on a command line.
source_secrets() {
  printf 'set -a; . %s; set +a' "\"\$HOME/$SECRETS_DIR/env\""
}

# Quotes one value for the remote shell.
q() {
  printf '%q' "$1"
}
