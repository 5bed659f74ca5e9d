#!/bin/sh
# UNTESTED HERE (no cloud access from our CI): an `exec` autoscaling provider for an AWS
# EC2 Auto Scaling group whose launch template starts notebookosd with a config that
# joins the cluster (cloud-init: issue the node certificate, then
# `nbos cluster join https://<a member>:8888`). Same JSON contract as
# examples/autoscale/local-dev-provider.py (docs/autoscaling.md). Needs aws-cli v2 and jq,
# and credentials in the daemon's environment (e.g. an instance profile).
#
#   [autoscale]
#   provider = "exec"
#   command = ["/usr/lib/notebookos/aws-asg-provider.sh", "notebookos-gpu-hosts"]
set -eu
group="$1"
req="$(cat)"
answer() { jq -cn --argjson ok "$1" --arg m "$2" '{ok: $ok, message: $m}'; exit 0; }
case "$(printf '%s' "$req" | jq -r .action)" in
  scale_out)
    count="$(printf '%s' "$req" | jq -r .count)"
    current="$(aws autoscaling describe-auto-scaling-groups --auto-scaling-group-names "$group" \
      --query 'AutoScalingGroups[0].DesiredCapacity' --output text)"
    aws autoscaling set-desired-capacity --auto-scaling-group-name "$group" \
      --desired-capacity $((current + count)) --honor-cooldown || answer false "set-desired-capacity failed"
    answer true "desired capacity of $group: $current -> $((current + count))" ;;
  release)
    # The host's name is its EC2 instance id (node.name = the instance id in the launch template).
    instance="$(printf '%s' "$req" | jq -r .host.name)"
    # Idempotent (a release is retried when its answer was lost): an instance no longer in the
    # group is released already.
    in_group="$(aws autoscaling describe-auto-scaling-instances --instance-ids "$instance" \
      --query 'length(AutoScalingInstances)' --output text)" || answer false "could not look up $instance"
    [ "$in_group" = 0 ] && answer true "$instance is no longer in $group"
    aws autoscaling terminate-instance-in-auto-scaling-group --instance-id "$instance" \
      --should-decrement-desired-capacity >/dev/null || answer false "could not terminate $instance"
    answer true "terminated $instance" ;;
  *) answer false "unknown action" ;;
esac
