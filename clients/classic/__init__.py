"""The classic algorithms' Flower ClientApp (``client_app``): one noisy release per request,
a table of release kinds, each booked in the node's ledger before its data is read. The
DP-SGD ClientApp is ``clients.client_app``."""
