#!/usr/bin/env bash
# Delete the TPU VM (checkpoints live in the workdir bucket, not on the VM).
set -euo pipefail
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --quiet
