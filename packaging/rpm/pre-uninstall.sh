# notebookosd %preun: on erase (not upgrade) stop and disable the service, and remove the
# .pth file %post wrote and the byte-compiled files Python wrote next to the helper.
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --no-reload disable --now notebookosd.service || :
    fi
    purelib=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))' 2>/dev/null) || purelib=
    [ -n "$purelib" ] && rm -f "$purelib/notebookos.pth"
    rm -rf /usr/lib/notebookos/python/nbos_kernel/__pycache__
fi
