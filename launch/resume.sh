#!/usr/bin/env bash
# After a preemption (or any stop): recreates the slice if it is gone or preempted, sets it up
# again at the same commit and reruns the same training command, which resumes from the newest
# checkpoint in WORKDIR. Takes the flags of create.sh, setup.sh and run.sh together.
#
#   launch/resume.sh --accelerator=v5p-128 --mode=queued --spot --env_file=FILE CONFIG WORKDIR [TRAIN_FLAG ...]
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

create=()
setup=()
run_args=()
positional=0
# Every argument is checked here, before create.sh provisions anything: a typo'd flag would
# otherwise reach only run.sh, after a default slice was created and set up.
for arg in "$@"; do
  case $arg in
    -h | --help) sed -n '2,7p' "$0"; usage_common; exit 0 ;;
    --mode=* | --spot | --no_wait) create+=("$arg") ;;
    --repo_url=* | --python=* | --skip_device_check) setup+=("$arg") ;;
    --commit=*) setup+=("$arg"); run_args+=("$arg") ;;
    --env_file=* | --page_reader=* | --skip_checks | --wait_s=*) run_args+=("$arg") ;;
    *)
      if common_flag "$arg"; then
        create+=("$arg"); setup+=("$arg"); run_args+=("$arg")
      else
        if ((positional < 2)); then
          [[ $arg != -* ]] || unknown_flag "$arg"
          positional=$((positional + 1))
        else
          check_train_flag "$arg"
        fi
        run_args+=("$arg")
      fi ;;
  esac
done
resolve_settings  # the accelerator, zone and name, checked before anything runs
((positional == 2)) || die "usage: launch/resume.sh [flags] CONFIG WORKDIR [TRAIN_FLAG ...] (see --help)"

"$LAUNCH_DIR/create.sh" ${create[@]+"${create[@]}"}
"$LAUNCH_DIR/setup.sh" ${setup[@]+"${setup[@]}"}
"$LAUNCH_DIR/run.sh" ${run_args[@]+"${run_args[@]}"}
