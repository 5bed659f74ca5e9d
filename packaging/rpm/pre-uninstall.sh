# notebookosd %preun: on erase (not upgrade) stop and disable the service, and remove the
# byte-compiled files Python wrote next to the nbos_kernel helper.
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --no-reload disable --now notebookosd.service || :
    fi
    rm -rf /usr/lib/python3/site-packages/nbos_kernel/__pycache__
fi
