#!/usr/bin/env bash
# Create a TPU VM pod slice (queued resources are friendlier on busy zones; see README).
set -euo pipefail
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" ${PREEMPTIBLE:+--preemptible}
