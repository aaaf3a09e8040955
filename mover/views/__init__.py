"""The operator's views: read models (status, history, report) and their renderings: everything a
command prints (watch, progress, the commands' text, errors). Read only."""
