#!/bin/sh
# Removes whatever the chaos harness (tests/chaos/) may have left behind after a crash or
# a kill: processes in the nbc* network namespaces (daemons, kernels, fault proxies),
# the namespaces, the bridge nbcbr0 and its veths, the loop-mounted state file systems
# and (unless --keep-logs) the /tmp/nbos-chaos-* directories. Safe to run any time no
# campaign is running; needs root.
set -u
keep_logs=0
[ "${1:-}" = "--keep-logs" ] && keep_logs=1

for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^nbc[0-9]*$'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -CONT "$pid" 2>/dev/null
        kill -KILL "$pid" 2>/dev/null
    done
done
sleep 0.5
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^nbc[0-9]*$'); do
    ip netns del "$ns" 2>/dev/null
done
for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^nbcv[0-9]*$'); do
    ip link del "$link" 2>/dev/null
done
ip link del nbcbr0 2>/dev/null
for m in $(awk '$2 ~ "^/tmp/nbos-chaos-[^/]*/h[0-9]*/state$" {print $2}' /proc/mounts); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
for img in /tmp/nbos-chaos-*/h*.img; do
    [ -e "$img" ] || continue
    for dev in $(losetup -j "$img" 2>/dev/null | cut -d: -f1); do
        losetup -d "$dev" 2>/dev/null
    done
    rm -f "$img"
done
if [ "$keep_logs" = 0 ]; then
    rm -rf /tmp/nbos-chaos-*
fi
echo "chaos cleanup done"
