#!/usr/bin/env bash
# Collects the workers' logs, then deletes the slice (checkpoints live in the gs:// workdir).
#
#   launch/teardown.sh --accelerator=v5e-64 [--mode=queued] [--skip_logs] [--dry_run]
#
# --mode=queued deletes the queued resource with its node (create.sh --mode=queued made both).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

MODE=${MODE:-on-demand}
LOGS=1
common=()
for arg in "$@"; do
  case $arg in
    --mode=*) MODE=${arg#*=} ;;
    --skip_logs) LOGS=0 ;;
    -h | --help) sed -n '2,6p' "$0"; usage_common; exit 0 ;;
    *) common_flag "$arg" || die "unknown argument '$arg' (see --help)"; common+=("$arg") ;;
  esac
done
resolve_settings

if [[ $LOGS == 1 ]]; then
  "$LAUNCH_DIR/logs.sh" ${common[@]+"${common[@]}"} || echo "warning: logs not collected" >&2
fi
case $MODE in
  queued) run gcloud compute tpus queued-resources delete "$TPU_NAME" "${LOCATION[@]}" --force --quiet ;;
  on-demand | spot) run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOCATION[@]}" --quiet ;;
  *) die "--mode=$MODE: expected on-demand, spot or queued" ;;
esac
