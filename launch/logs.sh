#!/usr/bin/env bash
# Copies every worker's logs (train.log, check_services.log, page_reader.log) into a local
# folder: LOG_DIR/worker-<i>/logs/. Workers that cannot be reached (preempted) are reported and
# skipped.
#
#   launch/logs.sh --accelerator=v5e-64 [--log_dir=DIR] [--dry_run]
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

for arg in "$@"; do
  case $arg in
    -h | --help) sed -n '2,6p' "$0"; usage_common; exit 0 ;;
    *) common_flag "$arg" || die "unknown argument '$arg' (see --help)" ;;
  esac
done
resolve_settings

failed=0
for ((worker = 0; worker < NUM_WORKERS; worker++)); do
  run mkdir -p "$LOG_DIR/worker-$worker"
  run gcloud compute tpus tpu-vm scp --recurse "$TPU_NAME:$REMOTE_DIR/logs" \
    "$LOG_DIR/worker-$worker/" "${LOCATION[@]}" --worker="$worker" || {
    echo "worker $worker: could not copy its logs" >&2
    failed=$((failed + 1))
  }
done
echo "logs of $((NUM_WORKERS - failed)) of $NUM_WORKERS workers in $LOG_DIR" >&2
