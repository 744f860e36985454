"""The connection keeper (`--persist`, docs/connections.md): OpenSSH's ControlPersist for
dtrain. A per-user background process (``server``) holds authenticated SSH connections; a
command's ``KeeperTransport`` (``client``) asks it for channels over a unix socket in the
user's private runtime directory and gets the frames back (``frames``), so a warm command
pays neither asyncssh's import nor a handshake. Whenever the keeper cannot serve, the
command connects directly.
"""
