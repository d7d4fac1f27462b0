#!/usr/bin/env bash
# Run training on all workers at once. Usage: launch/run.sh configs/X.py gs://bucket/workdir [--config.a=b ...]
# Every host runs the same command; matpo_jax.train calls jax.distributed.initialize() on pods.
# Re-running the same command after a preemption resumes from the latest Orbax checkpoint.
set -euo pipefail
source "$(dirname "$0")/common.sh"
config=$1; workdir=$2; shift 2
tpu_ssh_all "cd $REMOTE_DIR && nohup .venv/bin/python -m matpo_jax.train --config=$config \
  --workdir=$workdir --multihost $* > train.log 2>&1 &"
echo "started; follow with: gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --worker=0 --command='tail -f $REMOTE_DIR/train.log'"
