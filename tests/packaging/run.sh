#!/usr/bin/env bash
# `make test-packaging`: the packages as an operator meets them.
#
#  1. builds them (scripts/package.sh) and reports their sizes; the fake-cuda test double is
#     in notebookosd-fake-gpu alone;
#  2. lintian on the .debs: no error;
#  3. installs the .deb with apt into a fresh Debian 12 root (debootstrap --variant=minbase,
#     cached under $NBOS_PACKAGING_CACHE), and checks files, owners and modes, the kernels'
#     account, `notebookosd --check-config` on the shipped config, that the installed daemon
#     (simulated GPUs, from notebookosd-fake-gpu, which it says in its log) serves a cell
#     through its gateway to a kernel running as that account,
#     and that `dpkg --purge` leaves nothing behind but the account (Debian policy);
#  4. the .rpm as far as this machine allows: its file list, scripts and dependencies, and an
#     `rpm --root` install into a scratch root.
#
# Needs root (chroot, mounts). Without it: skipped with a reason, or failed when
# NBOS_REQUIRE_PRIVILEGED=1 (CI).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

say() { printf 'test-packaging: %s\n' "$*"; }
fail() { printf 'test-packaging: FAIL: %s\n' "$*" >&2; exit 1; }
if [ "$(id -u)" != 0 ]; then
    [ "${NBOS_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "needs root (chroot, mounts) and NBOS_REQUIRE_PRIVILEGED=1"
    say "SKIPPED: needs root (chroot, mounts)"
    exit 0
fi
for tool in debootstrap lintian rpm dpkg-deb readelf; do
    command -v "$tool" >/dev/null || fail "$tool is missing (make deps installs it)"
done

START=$(date +%s)
CACHE=${NBOS_PACKAGING_CACHE:-/var/cache/notebookos-packaging}
MIRROR=${NBOS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$CACHE/apt-archives/partial" "$CACHE/apt-lists/partial"
# One run at a time per cache (apt's locks, the base tarball).
exec 9>"$CACHE/lock"
flock 9

# Everything this run makes goes in cleanup, whichever way it ends.
X= B= ROOT= DAEMON_PID=
cleanup() {
    set +e
    trap - ERR
    walkthrough_cleanup
    if [ -n "$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null
        timeout 30 tail --pid="$DAEMON_PID" -f /dev/null || kill -9 "$DAEMON_PID" 2>/dev/null
    fi
    if [ -n "$ROOT" ]; then
        for m in var/cache/apt/archives var/lib/apt/lists sys dev proc; do
            mountpoint -q "$ROOT/$m" && umount -R -l "$ROOT/$m"
        done
        rm -rf --one-file-system "$ROOT"
    fi
    [ -n "$B" ] && rm -rf --one-file-system "$B"
    [ -n "$X" ] && rm -rf "$X"
}
trap cleanup EXIT
# A command that fails under `set -e` without a message of its own says where.
set -E
trap 'printf "test-packaging: FAIL: %s:%s: %s\n" "${BASH_SOURCE[0]}" "$LINENO" "$BASH_COMMAND" >&2' ERR
# shellcheck source=tests/packaging/walkthrough.sh
source "$REPO/tests/packaging/walkthrough.sh"

# 1. The packages.
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ -z "${NBOS_PACKAGES_DIR:-}" ]; then
    bash scripts/package.sh
    NBOS_PACKAGES_DIR="$TARGET_DIR/packages"
fi
PKGS=$NBOS_PACKAGES_DIR
DEB=$(ls "$PKGS"/notebookosd_*.deb)
DBGSYM=$(ls "$PKGS"/notebookosd-dbgsym_*.*deb)
RPM=$(ls "$PKGS"/notebookosd-[0-9]*.rpm)
DEBUGINFO=$(ls "$PKGS"/notebookosd-debuginfo-*.rpm)
# The simulated GPUs (the fake-cuda test double): a package of their own, never notebookosd's.
FAKE_DEB=$(ls "$PKGS"/notebookosd-fake-gpu_*.deb)
FAKE_RPM=$(ls "$PKGS"/notebookosd-fake-gpu-[0-9]*.rpm)
for p in "$DEB" "$DBGSYM" "$RPM" "$DEBUGINFO" "$FAKE_DEB" "$FAKE_RPM"; do
    say "size $(basename "$p"): $(du -k "$p" | cut -f1) KiB"
done
say "installed size of $(basename "$DEB"): $(dpkg-deb -f "$DEB" Installed-Size) KiB"

# The .deb's binaries are stripped; their debug info is in -dbgsym, matched by build id.
X=$(mktemp -d /tmp/nbos-pkgx.XXXXXX)
# readelf into a file: `readelf | grep -q` under pipefail fails when grep stops reading first.
not_stripped() { readelf -S "$1" > "$X/sections" && grep -q '\.debug_info' "$X/sections"; }
dpkg-deb -x "$DEB" "$X/deb"
dpkg-deb -x "$DBGSYM" "$X/dbg"
for bin in usr/bin/notebookosd usr/bin/nbos usr/lib/notebookos/libnbos_cuda_shim.so; do
    [ -f "$X/deb/$bin" ] || fail "$bin is not in the .deb"
    if not_stripped "$X/deb/$bin"; then fail "$bin in the .deb is not stripped"; fi
    id=$(readelf -n "$X/deb/$bin" | awk '/Build ID/ {print $3}')
    [ -n "$id" ] || fail "$bin has no build id"
    [ -f "$X/dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" ] || fail "no debug symbols for $bin (build id $id) in -dbgsym"
done
say "binaries stripped; debug symbols in $(basename "$DBGSYM") by build id"
[ -z "$(find "$X/deb" -name 'libfake_cuda*')" ] || fail "the test double is in $(basename "$DEB")"
dpkg-deb -x "$FAKE_DEB" "$X/fake"
[ -f "$X/fake/usr/lib/notebookos/libfake_cuda.so" ] || fail "libfake_cuda.so is not in $(basename "$FAKE_DEB")"
grep -q notebookosd <<<"$(dpkg-deb -f "$FAKE_DEB" Depends)" || fail "$(basename "$FAKE_DEB") does not depend on notebookosd"
grep -q 'TEST DOUBLE' <<<"$(dpkg-deb -f "$FAKE_DEB" Description)" || fail "$(basename "$FAKE_DEB") does not say it is a test double"
say "the test double is in $(basename "$FAKE_DEB") only"

# 2. lintian: errors fail, warnings are printed.
lintian --fail-on error "$DEB" | sed 's/^/lintian: /' || fail "lintian reports errors on $(basename "$DEB")"
lintian --fail-on error "$FAKE_DEB" | sed 's/^/lintian: /' || fail "lintian reports errors on $(basename "$FAKE_DEB")"
say "lintian: no error"

# 3. A fresh Debian 12 root, from a cached minbase tarball.
BASE="$CACHE/bookworm-minbase.tar"
if [ ! -f "$BASE" ]; then
    say "debootstrap bookworm minbase (cached in $BASE afterwards)"
    B=$(mktemp -d /tmp/nbos-debootstrap.XXXXXX)
    debootstrap --variant=minbase --cache-dir="$CACHE/apt-archives" bookworm "$B" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/debootstrap.log" >&2; fail "debootstrap failed"; }
    tar -C "$B" -cf "$BASE.partial" . && mv "$BASE.partial" "$BASE"
    rm -rf --one-file-system "$B"
    B=
fi
ROOT=$(mktemp -d /tmp/nbos-pkgroot.XXXXXX)
tar -C "$ROOT" -xf "$BASE"
chmod 755 "$ROOT" # mktemp's 0700 would keep the kernels' account out of its own /
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev"
mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys"
mount --bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives"
mount --bind "$CACHE/apt-lists" "$ROOT/var/lib/apt/lists"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
echo "deb $MIRROR bookworm main" > "$ROOT/etc/apt/sources.list"
in_root() { chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }
# apt as root in the root (the cache is a bind mount _apt cannot write); output kept for failures.
apt_in_root() { in_root apt-get -o APT::Sandbox::User=root -y -qq "$@" >"$X/apt.log" 2>&1 || { tail -40 "$X/apt.log" >&2; fail "apt-get $*"; }; }

# The dependencies first, so that the file lists before and after our package compare only it.
lists_age=$(( $(date +%s) - $(stat -c %Y "$CACHE/apt-lists.stamp" 2>/dev/null || echo 0) ))
if [ "$lists_age" -gt 86400 ]; then apt_in_root update && touch "$CACHE/apt-lists.stamp"; fi
deps=$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed 's/([^)]*)//; s/|.*//; s/ //g' | grep -v '^$' | tr '\n' ' ')
say "dependencies from the .deb: $deps"
# shellcheck disable=SC2086
apt_in_root install --no-install-recommends $deps
snapshot() { in_root find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/log -o -path /run \) -prune -o -print | sort; }
snapshot > "$X/before"

cp "$DEB" "$ROOT/tmp/notebookosd.deb"
apt_in_root install --no-install-recommends /tmp/notebookosd.deb
say "installed $(basename "$DEB") with apt in a Debian 12 minbase root"

# Files, owners, modes.
check_file() { # path owner:group mode
    local got
    got=$(in_root stat -c '%U:%G %a' "$1") || fail "$1 is not installed"
    [ "$got" = "$2 $3" ] || fail "$1 is $got, want $2 $3"
}
check_file /usr/bin/notebookosd root:root 755
check_file /usr/bin/nbos root:root 755
check_file /usr/lib/notebookos/libnbos_cuda_shim.so root:root 644
check_file /etc/notebookos/notebookosd.toml root:root 644
check_file /usr/lib/sysusers.d/notebookos.conf root:root 644
check_file /lib/systemd/system/notebookosd.service root:root 644
check_file /usr/share/jupyter/kernels/notebookos/kernel.json root:root 644
check_file /usr/share/jupyter/kernels/notebookos-1gpu/kernel.json root:root 644
check_file /usr/lib/python3/dist-packages/nbos_kernel/sync.py root:root 644
check_file /usr/share/man/man8/notebookosd.8.gz root:root 644
check_file /usr/share/man/man1/nbos.1.gz root:root 644
check_file /usr/share/man/man1/nbos-cluster-join.1.gz root:root 644
check_file /usr/share/bash-completion/completions/nbos root:root 644
check_file /usr/share/doc/notebookosd/copyright root:root 644
check_file /usr/share/notebookosd/prometheus/notebookos.rules.yml root:root 644
check_file /usr/share/notebookosd/grafana/notebookos.json root:root 644
grep -q /etc/notebookos/notebookosd.toml <<<"$(in_root dpkg-query -W -f='${Conffiles}\n' notebookosd)" ||
    fail "/etc/notebookos/notebookosd.toml is not a conffile"
in_root python3 -c 'import nbos_kernel.sync, ipykernel, cloudpickle' || fail "the installed Python cannot import the helper"
in_root nbos --version >/dev/null || fail "nbos does not run"
say "files, owners and modes as expected; the helper imports with Debian's python3"

# Every doc of docs/ that a shipped doc names is shipped too, in the .deb and the .rpm.
rpm -qpl "$RPM" > "$X/rpm.files"
[ -f "$X/deb/usr/share/doc/notebookosd/docs/operations.md" ] || fail "the manual (docs/operations.md) is not in $(basename "$DEB")"
for name in $(grep -ohE '[a-z][a-z0-9_-]*\.md' "$X"/deb/usr/share/doc/notebookosd/README.md "$X"/deb/usr/share/doc/notebookosd/docs/*.md | sort -u); do
    [ -f "docs/$name" ] || continue
    [ -f "$X/deb/usr/share/doc/notebookosd/docs/$name" ] || fail "$name is named by the shipped docs but not in $(basename "$DEB")"
    grep -qx "/usr/share/doc/notebookosd/docs/$name" "$X/rpm.files" || fail "$name is named by the shipped docs but not in $(basename "$RPM")"
done
say "every doc the shipped docs name is in the .deb and the .rpm"

# The kernels' account: a system user with no login and no home.
acct=$(in_root getent passwd notebookos-kernel) || fail "no notebookos-kernel account"
uid=$(echo "$acct" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "notebookos-kernel is not a system user (uid $uid)"
case "$acct" in *:/nonexistent:/usr/sbin/nologin) ;; *) fail "notebookos-kernel has a home or a shell: $acct" ;; esac
say "account: $acct"

# The shipped config is accepted as is.
out=$(in_root notebookosd --check-config --config /etc/notebookos/notebookosd.toml) || fail "the shipped config is refused: $out"
say "notebookosd --check-config: $out"

# The installed daemon with simulated GPUs (notebookosd-fake-gpu, installed as the manual's
# "Try it on a machine without a GPU" says) serves a cell through its gateway.
cp "$FAKE_DEB" "$ROOT/tmp/notebookosd-fake-gpu.deb"
apt_in_root install --no-install-recommends /tmp/notebookosd-fake-gpu.deb
check_file /usr/lib/notebookos/libfake_cuda.so root:root 644
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
( umask 077 && echo "$TOKEN" > "$ROOT/etc/notebookos/token" )
sed -e "s|^listen = .*|listen = \"127.0.0.1:$PORT\"|" \
    -e 's|^# token_file = .*|token_file = "/etc/notebookos/token"|' \
    -e 's|^driver = "auto"|driver = "fake"|' \
    -e 's|^fake_gpus = 0|fake_gpus = 1|' \
    "$ROOT/etc/notebookos/notebookosd.toml" > "$ROOT/etc/notebookos/test.toml"
in_root notebookosd --check-config --config /etc/notebookos/test.toml >/dev/null || fail "the test config is refused"
chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/bin/notebookosd --config /etc/notebookos/test.toml \
    >"$X/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$X/daemon.log" >&2; fail "the installed daemon exited"; }
    sleep 0.2
done
curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null || { tail -30 "$X/daemon.log" >&2; fail "the installed daemon does not answer"; }
cat > "$ROOT/tmp/cell.py" <<'PY'
# One cell through the Kernel Gateway API of the installed daemon, with Debian's Python
# (tornado and jupyter_client come with python3-ipykernel).
import json, os, sys, uuid
from urllib.request import Request, urlopen
from tornado import ioloop, websocket
from tornado.httpclient import HTTPRequest
base, token = sys.argv[1], sys.argv[2]
hdr = {"Authorization": f"token {token}", "Content-Type": "application/json"}
body = json.dumps({"name": "notebookos-python-1gpu"}).encode()
kernel = json.load(urlopen(Request(f"{base}/api/kernels", data=body, headers=hdr, method="POST")))
async def run():
    ws = await websocket.websocket_connect(
        HTTPRequest(f"{base.replace('http', 'ws')}/api/kernels/{kernel['id']}/channels", headers=hdr))
    msg_id = uuid.uuid4().hex
    code = "import os, pwd; print(6 * 7, pwd.getpwuid(os.getuid()).pw_name)"
    ws.write_message(json.dumps({"channel": "shell", "header": {"msg_id": msg_id, "msg_type": "execute_request",
        "session": "s", "username": "u", "version": "5.3", "date": ""}, "parent_header": {}, "metadata": {},
        "content": {"code": code, "silent": False}}))
    out, status = "", None
    while status is None or not out:
        m = json.loads(await ws.read_message())
        if m.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            out += m["content"]["text"]
        if m["msg_type"] == "execute_reply":
            status = m["content"]["status"]
    # The cell's GPU is committed or idle-held by its kernel right after it.
    gpus = json.load(urlopen(Request(f"{base}/api/v1/gpus", headers=hdr)))
    print(status, out.strip(), "held", gpus["committed"] + gpus["idle_held"], "of", gpus["total"])
ioloop.IOLoop.current().run_sync(run, timeout=120)
urlopen(Request(f"{base}/api/kernels/{kernel['id']}", headers=hdr, method="DELETE"))
PY
got=$(in_root python3 /tmp/cell.py "http://127.0.0.1:$PORT" "$TOKEN") || { tail -30 "$X/daemon.log" >&2; fail "the cell did not run"; }
# The cell ran as the kernels' account, bound to the host's one simulated GPU.
case "$got" in "ok 42 notebookos-kernel held 1 of 1") ;; *) tail -30 "$X/daemon.log" >&2; fail "the cell answered: $got" ;; esac
say "a 1-GPU cell ran through the installed daemon's gateway as notebookos-kernel: $got"
grep -q 'SIMULATED by the fake-cuda test double' "$X/daemon.log" || fail "the daemon did not say its GPUs are simulated"
say "the daemon's log says its GPUs are simulated"
kill "$DAEMON_PID"
timeout 30 tail --pid="$DAEMON_PID" -f /dev/null || fail "the installed daemon did not stop within 30 s of SIGTERM"
DAEMON_PID=
rm -f "$ROOT/etc/notebookos/test.toml" "$ROOT/etc/notebookos/token" "$ROOT/tmp/cell.py" \
    "$ROOT/tmp/notebookosd.deb" "$ROOT/tmp/notebookosd-fake-gpu.deb"

# Purge: nothing left but what policy keeps (the account, in /etc/passwd and /etc/group).
in_root dpkg --purge notebookosd-fake-gpu notebookosd >/dev/null
snapshot > "$X/after"
left=$(comm -13 "$X/before" "$X/after")
[ -z "$left" ] || fail "dpkg --purge left: $left"
in_root getent passwd notebookos-kernel >/dev/null || fail "purge removed the account (policy keeps it)"
say "dpkg --purge left no file behind; the account stays"

# 3b. The manual's walk-through: three hosts with TLS, Prometheus, a host killed under a
# notebook, a purge (walkthrough.sh), on overlays of the root as it is now (no notebookosd).
walkthrough

# 4. The .rpm: contents, scripts, dependencies, and an install into a scratch root.
rpm -qpl "$RPM" > "$X/rpm.list"
for f in /usr/bin/notebookosd /usr/bin/nbos /usr/lib/notebookos/libnbos_cuda_shim.so /etc/notebookos/notebookosd.toml \
    /usr/lib/systemd/system/notebookosd.service /usr/lib/sysusers.d/notebookos.conf \
    /usr/lib/notebookos/python/nbos_kernel/sync.py /usr/share/jupyter/kernels/notebookos/kernel.json \
    /usr/share/man/man8/notebookosd.8.gz /usr/share/man/man1/nbos.1.gz \
    /usr/share/notebookosd/prometheus/notebookos.rules.yml /usr/share/notebookosd/grafana/notebookos.json; do
    grep -qx "$f" "$X/rpm.list" || fail "$f is not in $(basename "$RPM")"
done
if grep -q libfake_cuda "$X/rpm.list"; then fail "the test double is in $(basename "$RPM")"; fi
grep -qx /usr/lib/notebookos/libfake_cuda.so <<<"$(rpm -qpl "$FAKE_RPM")" || fail "libfake_cuda.so is not in $(basename "$FAKE_RPM")"
grep -q '^notebookosd' <<<"$(rpm -qpR "$FAKE_RPM")" || fail "$(basename "$FAKE_RPM") does not require notebookosd"
rpm -qp --scripts "$RPM" > "$X/rpm.scripts"
grep -q 'notebookos-kernel' "$X/rpm.scripts" || fail "the .rpm does not create the kernels' account"
grep -q 'notebookos.pth' "$X/rpm.scripts" || fail "the .rpm does not put the helper on python3's path"
if grep -q 'rm -rf /var/lib/notebookos' "$X/rpm.scripts"; then fail "an rpm erase would remove the daemon's state"; fi
rpm -qpR "$RPM" > "$X/rpm.requires"
for dep in python3 python3-ipykernel python3-cloudpickle; do
    grep -q "^$dep" "$X/rpm.requires" || fail "the .rpm does not require $dep"
done
# Queries into a here-string: under pipefail, `rpm | grep -q` fails when grep stops reading first.
grep -qx /etc/notebookos/notebookosd.toml <<<"$(rpm -qp --configfiles "$RPM")" || fail "notebookosd.toml is not %config in the .rpm"
grep -qx /usr/lib/debug/usr/bin/notebookosd.debug <<<"$(rpm -qpl "$DEBUGINFO")" || fail "no notebookosd.debug in $(basename "$DEBUGINFO")"
rpm_version=$(rpm -qp --queryformat '%{VERSION}-%{RELEASE}' "$RPM")
grep -qx "notebookosd = $rpm_version" <<<"$(rpm -qpR "$DEBUGINFO")" ||
  fail "$(basename "$DEBUGINFO") does not require exactly notebookosd $rpm_version: $(rpm -qpR "$DEBUGINFO" | tr '\n' ' ')"
RROOT="$X/rpmroot"
mkdir -p "$RROOT"
rpm --root "$RROOT" --initdb
rpm --root "$RROOT" -i --nodeps --noscripts "$RPM" "$DEBUGINFO"
[ "$(stat -c '%a' "$RROOT/usr/bin/notebookosd")" = 755 ] || fail "the .rpm installs notebookosd with mode $(stat -c '%a' "$RROOT/usr/bin/notebookosd")"
if not_stripped "$RROOT/usr/bin/notebookosd"; then fail "the .rpm's notebookosd is not stripped"; fi
"$RROOT/usr/bin/nbos" --version >/dev/null || fail "the .rpm's nbos does not run"
rpm --root "$RROOT" -e --nodeps --noscripts notebookosd-debuginfo notebookosd
[ ! -e "$RROOT/usr/bin/notebookosd" ] || fail "rpm -e left /usr/bin/notebookosd"
say ".rpm: files, %config, scripts, requires; installed into and erased from a scratch root (--nodeps: no Fedora repository here)"
say "PASSED in $(( $(date +%s) - START )) s"
