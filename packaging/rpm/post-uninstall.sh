# notebookosd %postun: on erase (not upgrade) the daemon's state goes; the account stays.
if [ "$1" -eq 0 ]; then
    rm -rf /var/lib/notebookos /run/notebookos
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
fi
