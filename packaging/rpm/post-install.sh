# notebookosd %post: the kernels' account (kernel.user), and the nbos_kernel helper on
# python3's path (it lives in /usr/lib/notebookos/python; a .pth file in python3's own
# site-packages, whichever version that is, adds it).
if ! getent passwd notebookos-kernel >/dev/null; then
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers notebookos.conf || :
    else
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /sbin/nologin --comment "NotebookOS kernels" notebookos-kernel || :
    fi
fi
purelib=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))' 2>/dev/null) || purelib=
if [ -n "$purelib" ] && [ -d "$purelib" ]; then
    echo /usr/lib/notebookos/python > "$purelib/notebookos.pth"
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
fi
