#!/usr/bin/env bash
# Creates the TPU slice: on demand, as Spot VMs, or through a queued resource (waits in the
# Cloud TPU queue until capacity frees up; the friendliest on busy zones).
#
#   launch/create.sh --accelerator=v5e-64 [--mode=on-demand|spot|queued] [--spot] [--dry_run]
#
# Safe to rerun (resume.sh does): a slice that is READY (queued: ACTIVE) is kept; a preempted,
# failed or suspended one is deleted and created again. --mode=queued with --spot asks for
# Spot capacity through the queue.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

MODE=${MODE:-on-demand}
SPOT=0
WAIT=1
for arg in "$@"; do
  case $arg in
    --mode=*) MODE=${arg#*=} ;;
    --spot) SPOT=1 ;;
    --no_wait) WAIT=0 ;;
    -h | --help)
      sed -n '2,9p' "$0"
      echo "  --no_wait              return once the request is made (queued: do not wait for ACTIVE)"
      usage_common
      exit 0 ;;
    *) common_flag "$arg" || die "unknown argument '$arg' (see --help)" ;;
  esac
done
resolve_settings
case $MODE in
  on-demand | spot | queued) ;;
  *) die "--mode=$MODE: expected on-demand, spot or queued" ;;
esac
[[ $MODE == spot ]] && SPOT=1

# STATE := the state the describe command "$@" prints, empty when there is none (or --dry_run).
query_state() {
  STATE=
  if [[ $DRY_RUN == 1 ]]; then
    run "$@"
  else
    STATE=$("$@" 2>/dev/null) || STATE=
  fi
}

create_node() {
  local cmd=(gcloud compute tpus tpu-vm create "$TPU_NAME" "${LOCATION[@]}"
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
  if [[ $SPOT == 1 ]]; then
    cmd+=(--spot)
  fi
  run "${cmd[@]}"
}

create_queued() {
  local cmd=(gcloud compute tpus queued-resources create "$TPU_NAME" "${LOCATION[@]}"
    --node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE"
    --runtime-version="$RUNTIME_VERSION")
  if [[ $SPOT == 1 ]]; then
    cmd+=(--spot)
  fi
  run "${cmd[@]}"
}

if [[ $MODE == queued ]]; then
  query_state gcloud compute tpus queued-resources describe "$TPU_NAME" "${LOCATION[@]}" \
    --format='value(state.state)'
  case $STATE in
    ACTIVE | WAITING_FOR_RESOURCES | PROVISIONING | ACCEPTED | CREATING)
      echo "queued resource $TPU_NAME is $STATE: kept" >&2 ;;
    "") create_queued ;;
    *)
      echo "queued resource $TPU_NAME is $STATE: deleting it and queueing again" >&2
      run gcloud compute tpus queued-resources delete "$TPU_NAME" "${LOCATION[@]}" --force --quiet
      create_queued ;;
  esac
  if [[ $WAIT == 1 && $DRY_RUN != 1 ]]; then
    echo "waiting for queued resource $TPU_NAME to become ACTIVE (Ctrl-C stops waiting, not the request)" >&2
    while true; do
      query_state gcloud compute tpus queued-resources describe "$TPU_NAME" "${LOCATION[@]}" \
        --format='value(state.state)'
      case $STATE in
        ACTIVE) break ;;
        FAILED | SUSPENDED) die "queued resource $TPU_NAME is $STATE" ;;
      esac
      sleep 60
    done
  fi
else
  query_state gcloud compute tpus tpu-vm describe "$TPU_NAME" "${LOCATION[@]}" \
    --format='value(state)'
  case $STATE in
    READY | CREATING | STARTING | RESTARTING) echo "TPU VM $TPU_NAME is $STATE: kept" >&2 ;;
    "") create_node ;;
    *)
      echo "TPU VM $TPU_NAME is $STATE: deleting it and creating it again" >&2
      run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOCATION[@]}" --quiet
      create_node ;;
  esac
fi
echo "next: launch/setup.sh --name=$TPU_NAME --accelerator=$ACCELERATOR $(location_text)" >&2
