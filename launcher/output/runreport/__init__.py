"""`dtrain report`'s pure half: an archive's records -> a run summary -> a page or a document.

    digest.py    output.jsonl, one record at a time: per-rank spans, tails, metric points
    curves.py    the metric patterns, per-rank series, the mean over ranks, thinning
    usage.py     samples.jsonl -> per-node utilisation series
    summary.py   meta.json + the above -> RunSummary (header, lanes, attempts, hangs, ...)
    document.py  RunSummary -> the --json document (dtrain.report/1)
    timeline.py  RunSummary -> the timeline as inline SVG
    page.py      RunSummary -> the self-contained HTML page (safe.py escapes node text)
    assets/      uPlot (vendored, MIT), the page's CSS and script

Nothing here opens a file of the archive: launcher/commands/report/ reads it and feeds these.
"""
