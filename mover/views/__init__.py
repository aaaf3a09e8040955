"""The operator's views: read models (status, history, report) and their renderings (watch, progress).
Read only."""
