# Shared settings for the TPU launch scripts. Override any of them in the environment.
: "${TPU_NAME:=matpo-v5e-64}"
: "${ZONE:=us-west4-a}"
: "${PROJECT:=$(gcloud config get-value project 2>/dev/null)}"
: "${ACCELERATOR_TYPE:=v5litepod-64}"
: "${RUNTIME_VERSION:=v2-alpha-tpuv5-lite}"
: "${REPO_URL:=}"            # git URL of your matpo_jax fork; empty = copy the local tree with scp
: "${REMOTE_DIR:=matpo_jax}"

tpu_ssh_all() {
  # Run one command on every worker of the pod slice (multi-host JAX needs all hosts to run it).
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --worker=all --command="$1"
}
