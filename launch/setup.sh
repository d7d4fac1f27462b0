#!/usr/bin/env bash
# Put the code on every worker and install it with the TPU extra.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [[ -n "$REPO_URL" ]]; then
  tpu_ssh_all "rm -rf $REMOTE_DIR && git clone -q $REPO_URL $REMOTE_DIR"
else
  tar czf /tmp/matpo_jax_src.tgz --exclude=.venv --exclude=runs --exclude=.git -C "$(dirname "$0")/.." .
  gcloud compute tpus tpu-vm scp /tmp/matpo_jax_src.tgz "$TPU_NAME":/tmp/ --zone="$ZONE" \
    --project="$PROJECT" --worker=all
  tpu_ssh_all "mkdir -p $REMOTE_DIR && tar xzf /tmp/matpo_jax_src.tgz -C $REMOTE_DIR"
fi
tpu_ssh_all "cd $REMOTE_DIR && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
