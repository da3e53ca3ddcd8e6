"""DP algorithms beyond DP-SGD, from the papers fedpriv grew from (docs/classic.md)."""
