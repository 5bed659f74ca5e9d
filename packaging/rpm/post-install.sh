# notebookosd %post: the kernels' account (kernel.user).
if ! getent passwd notebookos-kernel >/dev/null; then
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers notebookos.conf || :
    else
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /sbin/nologin --comment "NotebookOS kernels" notebookos-kernel || :
    fi
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
fi
