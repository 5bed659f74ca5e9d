# notebookosd %postun: RPM has no purge, so the daemon's state (/var/lib/notebookos: raft
# logs, the node's identity) and the kernels' account stay after an erase; remove the
# directory by hand to forget the host.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
fi
