"""The classic algorithms' Flower ServerApp (``server_app``) and its loops (``loops``: ask
every node for its noisy share, add the shares, finish on the server). The DP-SGD
ServerApp is ``server.server_app``."""
