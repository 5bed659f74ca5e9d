# shellcheck shell=bash
# The manual's walk-through (docs/operations.md, "Three hosts from packages, with mutual TLS"),
# run from the manual itself: every block marked `<!-- walkthrough: NAME -->` there is read
# out of the file and run as written, on the machine the manual says.
#
# Sourced by tests/packaging/run.sh once its Debian root ($ROOT, with the package's
# dependencies, no notebookosd) is free. Machines: one without a GPU (the manual's "Try it on
# a machine without a GPU", with notebookosd-fake-gpu), an admin and three hosts, each an overlay
# of $ROOT (a root of its own) in a network namespace (10.0.0.N, gpu-host-N.example; the
# admin 10.0.0.10) joined by a bridge in a namespace of its own (nothing touches the
# machine's network), a PID and UTS namespace (killing a host kills every process of it).
# What is stood in for: `systemctl` (tests/packaging/systemctl-standin.py: no systemd runs
# here) and `scp` (files are copied between the roots). NFS: the hosts' object store is one
# directory bind-mounted into each.
#
# Then, as a user on host 1, a notebook through the packaged `notebookos` kernelspec with
# nbclient and nothing but NBOS_TOKEN set; host 1 is killed between its cells, the notebook
# completes with its state, and its kernel is deleted through a survivor. Last, the dead
# host is removed (`nbos cluster remove`) and another host's package purged.

WT_MACHINES=(solo admin h1 h2 h3)
WT= WT_INITS=() WT_CLIENT=

walkthrough_cleanup() {
    set +e
    trap - ERR
    [ -n "$WT_CLIENT" ] && kill -9 "$WT_CLIENT" 2>/dev/null
    for pid in "${WT_INITS[@]}"; do kill -9 "$pid" 2>/dev/null; done
    # A PID namespace's processes die with its init; its mounts are busy until they have.
    for pid in "${WT_INITS[@]}"; do timeout 10 tail --pid="$pid" -f /dev/null; done
    if [ -n "$WT" ]; then
        for m in "${WT_MACHINES[@]}"; do
            mountpoint -q "$WT/$m/root" && umount -R -l "$WT/$m/root"
            ip netns del "nbwt-$m" 2>/dev/null
        done
        ip netns del nbwt-lan 2>/dev/null
        rm -rf --one-file-system "$WT"
    fi
}

# The block NAME of the manual, its list indentation removed.
wt_block() {
    awk -v mark="<!-- walkthrough: $1 -->" '
        index($0, mark) { found = 1; next }
        found == 1 && /^ *```bash/ { found = 2; next }
        found == 2 && /^ *```/ { exit }
        found == 2 { sub(/^   /, ""); print }' "$REPO/docs/operations.md"
}

wt_ip() { case $1 in admin) echo 10.0.0.10 ;; solo) echo 10.0.0.20 ;; h*) echo "10.0.0.${1#h}" ;; esac; }

# Runs bash code on machine M as root, in its namespaces and root, from /root.
wt_on() {
    local m=$1 pid
    shift
    pid=${WT_INITS[$(wt_index "$m")]}
    nsenter -t "$pid" -p -m -n -u -r -w -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive bash -euo pipefail -c "cd /root; $*" </dev/null
}
wt_index() {
    local i
    for i in "${!WT_MACHINES[@]}"; do
        if [ "${WT_MACHINES[$i]}" = "$1" ]; then echo "$i"; return 0; fi
    done
    fail "no machine $1"
}

# Runs the manual's block NAME on machine M (after SUBST, a sed script, if given).
wt_run_block() {
    local m=$1 name=$2 subst=${3:-} code
    code=$(wt_block "$name")
    [ -n "$code" ] || fail "docs/operations.md has no walkthrough block $name"
    [ -n "$subst" ] && code=$(sed "$subst" <<<"$code")
    say "walk-through: block '$name' on $m"
    wt_on "$m" "$code" >"$X/wt-$name-$m.log" 2>&1 || {
        cat "$X/wt-$name-$m.log" >&2
        wt_on "$m" 'tail -30 /var/log/notebookosd.log 2>/dev/null' >&2 || true
        fail "the manual's block '$name' failed on $m"
    }
}

walkthrough() {
    local start m r i
    start=$(date +%s)
    # What the walk-through uses beyond the package's dependencies: sudo (the manual's
    # commands), nbclient (the user's notebook runner), Prometheus (its step); no service starts
    # at install in a root (policy-rc.d).
    printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    apt_in_root install --no-install-recommends sudo python3-nbclient python3-nbformat python3-numpy prometheus
    WT=$(mktemp -d /tmp/nbos-walk.XXXXXX)
    chmod 755 "$WT"
    mkdir -p "$WT/objects"
    ip netns add nbwt-lan
    ip -n nbwt-lan link add br0 type bridge
    ip -n nbwt-lan link set br0 up
    for m in "${WT_MACHINES[@]}"; do
        mkdir -p "$WT/$m/up" "$WT/$m/work" "$WT/$m/root"
        r=$WT/$m/root
        mount -t overlay overlay -o "lowerdir=$ROOT,upperdir=$WT/$m/up,workdir=$WT/$m/work" "$r"
        mount --rbind /dev "$r/dev" && mount --make-rslave "$r/dev"
        mount --rbind /sys "$r/sys" && mount --make-rslave "$r/sys"
        mount -t proc proc "$r/proc"
        mount --bind "$CACHE/apt-archives" "$r/var/cache/apt/archives"
        mount --bind "$CACHE/apt-lists" "$r/var/lib/apt/lists"
        if [ "$m" != admin ]; then
            mkdir -p "$r/srv/notebookos-objects"
            mount --bind "$WT/objects" "$r/srv/notebookos-objects"
        fi
        for i in 1 2 3; do echo "10.0.0.$i gpu-host-$i.example gpu-host-$i"; done >> "$r/etc/hosts"
        echo "$(wt_ip "$m") $m" >> "$r/etc/hosts"
        # Machines have ids of their own (the daemon tells its cgroups from another's by it).
        head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$r/etc/machine-id"
        install -m 0755 "$REPO/tests/packaging/systemctl-standin.py" "$r/usr/local/sbin/systemctl"
        ln -s systemctl "$r/usr/local/sbin/journalctl"
        cp "$DEB" "$r/root/"
        [ "$m" = solo ] && cp "$FAKE_DEB" "$r/root/"
        ip netns add "nbwt-$m"
        ip -n nbwt-lan link add "v-$m" type veth peer name eth0 netns "nbwt-$m"
        ip -n nbwt-lan link set "v-$m" master br0 up
        ip -n "nbwt-$m" addr add "$(wt_ip "$m")/24" dev eth0
        ip -n "nbwt-$m" link set eth0 up
        ip -n "nbwt-$m" link set lo up
        local name=$m
        case $m in h*) name=gpu-host-${m#h} ;; esac
        ip netns exec "nbwt-$m" unshare --pid --uts --fork --mount-proc="$r/proc" \
            chroot "$r" /bin/sh -c "hostname $name; exec sleep infinity" &
        local outer=$! inner=
        for _ in $(seq 1 50); do inner=$(pgrep -P "$outer" || true); [ -n "$inner" ] && break; sleep 0.1; done
        [ -n "$inner" ] || fail "machine $m did not start"
        WT_INITS+=("$inner")
    done
    say "walk-through: five machines, each a root and namespaces of its own ($(( $(date +%s) - start )) s)"

    # 0. One machine without a GPU, from the packages ("Try it on a machine without a GPU").
    wt_run_block solo nogpu
    grep -q 'SIMULATED' "$X/wt-nogpu-solo.log" || { cat "$X/wt-nogpu-solo.log" >&2; fail "the journal does not say the GPUs are simulated"; }
    grep -q 'Simulated GPU (fake-cuda test double)' "$X/wt-nogpu-solo.log" ||
        { cat "$X/wt-nogpu-solo.log" >&2; fail "nbos status does not name the simulated GPUs"; }
    cp "$REPO/tests/packaging/notebook_one_gpu.py" "$WT/solo/root/root/nb.py"
    local got
    got=$(wt_on solo 'python3 nb.py') || fail "a 1-GPU notebook through the packaged kernelspec failed: $got"
    [ "$got" = "42 2" ] || fail "the 1-GPU notebook printed: $got"
    say "walk-through: a machine without a GPU runs a 1-GPU notebook on the simulated GPUs, as the manual says"

    # 1. The PKI and tokens on the admin machine, as the manual says; then "scp" to the hosts.
    wt_run_block admin pki
    for i in 1 2 3; do
        r=$WT/h$i/root/root
        mkdir -p "$r/pki"
        cp -p "$WT/admin/root/root/pki/ca.pem" "$WT/admin/root/root/pki/node-$i.pem" "$WT/admin/root/root/pki/node-$i.key" "$r/pki/"
        cp -p "$WT/admin/root/root/token" "$WT/admin/root/root/operator-token" "$r/"
    done
    [ "$(stat -c %a "$WT/admin/root/root/token")" = 600 ] || fail "the manual's token file is not 0600"

    # 2. Each host, as the manual says.
    for i in 1 2 3; do
        wt_run_block "h$i" host "s/^N=1 /N=$i /"
    done
    # 3. The cluster forms: the manual's check, once every host is up.
    local status=
    for _ in $(seq 1 150); do
        status=$(wt_on admin 'NBOS_CA_CERT=pki/ca.pem NBOS_TOKEN=$(cat token) nbos --url https://gpu-host-1.example:8888 cluster status --json' 2>/dev/null) &&
            [ "$(python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(1 for h in s["members"] if h["up"]))' <<<"$status" 2>/dev/null)" = 3 ] && break
        status=
        sleep 0.2
    done
    [ -n "$status" ] || { wt_on h1 'tail -20 /var/log/notebookosd.log' >&2; fail "three live hosts did not form a cluster within 30 s"; }
    wt_run_block admin check
    grep -q "3 of 3 host(s) up" "$X/wt-check-admin.log" || { cat "$X/wt-check-admin.log" >&2; fail "cluster status does not show three hosts up"; }
    say "walk-through: three hosts with mutual TLS form a cluster ($(( $(date +%s) - start )) s); nbos status on a host:"
    wt_on h2 'nbos status' | sed 's/^/    /' || fail "nbos status on host 2 (its endpoint file's URL and CA) failed"

    # 4. Prometheus on the admin machine scrapes the three hosts over HTTPS.
    wt_run_block admin prometheus
    local up=
    for _ in $(seq 1 60); do
        up=$(ip netns exec nbwt-admin curl -sf 'http://127.0.0.1:9090/api/v1/query?query=up%7Bjob%3D%22notebookosd%22%7D' |
            python3 -c 'import json,sys; print(sum(1 for r in json.load(sys.stdin)["data"]["result"] if r["value"][1] == "1"))' 2>/dev/null) || up=
        [ "$up" = 3 ] && break
        sleep 1
    done
    [ "$up" = 3 ] || { wt_on admin 'tail -20 /var/log/prometheus.log' >&2; fail "Prometheus does not scrape three hosts (up: ${up:-none})"; }
    say "walk-through: Prometheus scrapes the three hosts over HTTPS (up == 1 for 3)"

    # 5. A user's notebook through the packaged kernelspec on host 1; host 1 dies between cells.
    wt_on h1 'useradd --create-home alice && install -d -m 0777 /tmp/marks'
    cp "$REPO/tests/packaging/notebook_across_host_kill.py" "$WT/h1/root/home/alice/nb.py"
    local token
    token=$(cat "$WT/admin/root/root/token")
    ip netns exec nbwt-h1 chroot "$WT/h1/root" runuser -u alice -- env -i PATH=/usr/bin:/bin HOME=/home/alice \
        LANG=C.UTF-8 NBOS_TOKEN="$token" python3 /home/alice/nb.py /tmp/marks >"$X/wt-notebook.log" 2>&1 &
    WT_CLIENT=$!
    for _ in $(seq 1 900); do
        [ -e "$WT/h1/root/tmp/marks/cell1-done" ] && break
        kill -0 "$WT_CLIENT" 2>/dev/null || { cat "$X/wt-notebook.log" >&2; fail "the notebook ended before its first cell"; }
        sleep 0.2
    done
    [ -e "$WT/h1/root/tmp/marks/cell1-done" ] || { cat "$X/wt-notebook.log" >&2; fail "the notebook's first cell did not run within 180 s"; }
    kill -9 "${WT_INITS[$(wt_index h1)]}"   # host 1's PID namespace: its daemon, kernels and pool all die
    touch "$WT/h1/root/tmp/marks/host-killed"
    say "walk-through: host 1 killed between the notebook's cells"
    wait "$WT_CLIENT" || { cat "$X/wt-notebook.log" >&2; fail "the notebook failed after its host was killed"; }
    WT_CLIENT=
    grep -qx 'cell2 42' "$X/wt-notebook.log" && grep -qx 'cell3 84' "$X/wt-notebook.log" ||
        { cat "$X/wt-notebook.log" >&2; fail "the notebook lost its state across the host kill"; }
    say "walk-through: the notebook completed with its state ($(grep -c '^cell' "$X/wt-notebook.log") cells)"
    local left=
    for _ in $(seq 1 100); do
        left=$(wt_on admin 'NBOS_CA_CERT=pki/ca.pem NBOS_TOKEN=$(cat token) nbos --url https://gpu-host-2.example:8888 kernels --json' |
            python3 -c 'import json,sys; print(len(json.load(sys.stdin)["kernels"]))') || left=
        [ "$left" = 0 ] && break
        sleep 0.2
    done
    [ "$left" = 0 ] || fail "the notebook's kernel was not deleted through a survivor (kernels: ${left:-?})"
    say "walk-through: its kernel was deleted through a surviving host"

    # 6. The dead host out of the cluster, and a host's package purged.
    wt_on admin 'NBOS_CA_CERT=pki/ca.pem NBOS_OPERATOR_TOKEN=$(cat operator-token) nbos --url https://gpu-host-2.example:8888 cluster remove 1' ||
        fail "nbos cluster remove 1 failed"
    wt_run_block h3 purge
    for f in /usr/bin/notebookosd /var/lib/notebookos /etc/notebookos/notebookosd.toml; do
        [ ! -e "$WT/h3/root$f" ] || fail "apt purge left $f on host 3"
    done
    say "walk-through: host 1 removed from the cluster; apt purge on host 3 left nothing of the package"
    say "walk-through: PASSED in $(( $(date +%s) - start )) s"
    walkthrough_cleanup
    WT= WT_INITS=()
}
