#!/usr/bin/env bash
# Puts the project at one git commit on every worker, in a Python 3.11 virtual environment with
# the TPU extra, and checks that every worker sees the whole slice.
#
#   launch/setup.sh --accelerator=v5e-64 [--commit=REV] [--repo_url=URL] [--dry_run]
#
# The code: with --repo_url every worker clones (or fetches) the repository and checks out the
# commit; without it the commit is exported locally with `git archive` and copied to every
# worker. Either way it is the committed tree (uncommitted changes are refused) and each worker
# writes the commit it holds to REMOTE_DIR/COMMIT, which run.sh checks.
# Python: the TPU VM images ship Python 3.10 (jax 0.10 needs >= 3.11), so uv installs 3.11 in the
# user's home; the environment is REMOTE_DIR/.venv and survives a re-setup (resume).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

COMMIT=HEAD
REPO_URL=${REPO_URL:-}
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
CHECK_DEVICES=1
for arg in "$@"; do
  case $arg in
    --commit=*) COMMIT=${arg#*=} ;;
    --repo_url=*) REPO_URL=${arg#*=} ;;
    --python=*) PYTHON_VERSION=${arg#*=} ;;
    --skip_device_check) CHECK_DEVICES=0 ;;
    -h | --help)
      sed -n '2,12p' "$0"
      echo "  --python=X.Y           Python version of the environment (>= 3.11) [PYTHON_VERSION, default 3.11]"
      echo "  --skip_device_check    do not start JAX on every worker at the end"
      usage_common
      exit 0 ;;
    *) common_flag "$arg" || die "unknown argument '$arg' (see --help)" ;;
  esac
done
resolve_settings
[[ $PYTHON_VERSION =~ ^3\.(1[1-9]|[2-9][0-9])$ ]] || die "--python=$PYTHON_VERSION: jax 0.10 needs 3.11 or newer"

SHA=$(git -C "$REPO_ROOT" rev-parse --verify "$COMMIT^{commit}") ||
  die "--commit=$COMMIT is not a commit of $REPO_ROOT"
if [[ $COMMIT == HEAD && -n $(git -C "$REPO_ROOT" status --porcelain --untracked-files=no) ]]; then
  message="uncommitted changes in $REPO_ROOT: commit them first (every worker gets commit $SHA)"
  if [[ $DRY_RUN == 1 ]]; then
    echo "warning (dry run): $message" >&2
  else
    die "$message"
  fi
fi
dir=$(q "$REMOTE_DIR")

# 1. The code at $SHA.
if [[ -n $REPO_URL ]]; then
  ssh_all "set -euo pipefail
if [ -d $dir/.git ]; then git -C $dir fetch --quiet origin; else git clone --quiet $(q "$REPO_URL") $dir; fi
git -C $dir checkout --quiet --detach $SHA
echo $SHA > $dir/COMMIT"
else
  archive=/tmp/matpo_jax-$SHA.tar.gz
  run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" "$SHA"
  run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:/tmp/" "${LOCATION[@]}" --worker=all
  # Replace everything but the environment and the logs, so a re-setup keeps .venv.
  ssh_all "set -euo pipefail
mkdir -p $dir
find $dir -mindepth 1 -maxdepth 1 ! -name .venv ! -name logs -exec rm -rf {} +
tar -xzf /tmp/matpo_jax-$SHA.tar.gz -C $dir
rm -f /tmp/matpo_jax-$SHA.tar.gz
echo $SHA > $dir/COMMIT"
fi

# 2. Python >= 3.11 and the project with the TPU extra (jax[tpu] pulls libtpu).
ssh_all "set -euo pipefail
export PATH=\"\$HOME/.local/bin:\$PATH\"
command -v uv >/dev/null || python3 -m pip install --user --quiet 'uv>=0.5'
uv python install $PYTHON_VERSION
[ -x $dir/.venv/bin/python ] || uv venv --quiet --python $PYTHON_VERSION $dir/.venv
cd $dir
uv pip install --quiet --python .venv/bin/python -e '.[tpu]'
.venv/bin/python -c 'import sys; assert sys.version_info >= (3, 11), sys.version'"

# 3. Every worker runs JAX over the whole slice (all workers at once, as training will).
if [[ $CHECK_DEVICES == 1 ]]; then
  ssh_all "cd $dir && .venv/bin/python -c 'import jax; jax.distributed.initialize(); print(\"worker\", jax.process_index(), \"of\", jax.process_count(), \"commit\", open(\"COMMIT\").read().strip(), \"devices\", jax.local_device_count(), \"of\", jax.device_count())'"
fi
echo "next: launch/run.sh --name=$TPU_NAME --accelerator=$ACCELERATOR $(location_text) --env_file=FILE CONFIG WORKDIR" >&2
