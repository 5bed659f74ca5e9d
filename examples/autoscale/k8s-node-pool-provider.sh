#!/bin/sh
# UNTESTED HERE (no Kubernetes in our CI): an `exec` autoscaling provider that scales a
# Deployment of notebookosd pods, one per GPU node of a node pool (the cluster
# autoscaler adds nodes for pods that do not fit; each pod's entrypoint issues its node
# certificate and runs `nbos cluster join`). Same JSON contract as
# examples/autoscale/local-dev-provider.py (docs/autoscaling.md). Needs kubectl and jq.
#
#   [autoscale]
#   provider = "exec"
#   command = ["/usr/lib/notebookos/k8s-node-pool-provider.sh", "notebookos", "notebookosd-gpu"]
set -eu
namespace="$1"; deployment="$2"
req="$(cat)"
answer() { jq -cn --argjson ok "$1" --arg m "$2" '{ok: $ok, message: $m}'; exit 0; }
replicas() { kubectl -n "$namespace" get deployment "$deployment" -o jsonpath='{.spec.replicas}'; }
case "$(printf '%s' "$req" | jq -r .action)" in
  scale_out)
    count="$(printf '%s' "$req" | jq -r .count)"; now="$(replicas)"
    kubectl -n "$namespace" scale deployment "$deployment" --replicas=$((now + count)) >/dev/null \
      || answer false "kubectl scale failed"
    answer true "$deployment: $now -> $((now + count)) pods" ;;
  release)
    # The host has left the cluster: make its pod the one the Deployment removes when it
    # shrinks by one (pod deletion cost), then shrink it (node.name = pod name).
    name="$(printf '%s' "$req" | jq -r .host.name)"; now="$(replicas)"
    # Idempotent (a release is retried when its answer was lost): a pod already gone is released.
    kubectl -n "$namespace" get pod "$name" >/dev/null 2>&1 || answer true "pod $name is already gone"
    kubectl -n "$namespace" annotate --overwrite pod "$name" controller.kubernetes.io/pod-deletion-cost=-1000000 \
      >/dev/null || answer false "could not mark pod $name for deletion"
    kubectl -n "$namespace" scale deployment "$deployment" --replicas=$((now - 1)) >/dev/null \
      || answer false "kubectl scale failed"
    answer true "$deployment: $now -> $((now - 1)) pods, $name removed" ;;
  *) answer false "unknown action" ;;
esac
