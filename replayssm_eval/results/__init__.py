"""What a run keeps and the tables built from it, shared by `kl`, `accuracy`, `regress` and `reports`.

    files           atomic writes, JSON read back with errors that name the file
    provenance      versions, git commit, the JSON-safe copy of a result
    kl_store        a KL run directory: run settings, per-document metrics, the batch in flight (resumable)
    accuracy_store  an accuracy run directory: per config, lm-eval's samples and results of each task (resumable)
    buckets         length buckets of the KL and of the accuracy, and the KL statistics per bucket
    stats           paired statistics of a config's accuracy against FP32
    kl_tables       the tables of kl.json and its per-bucket CSV
    accuracy_tables the tables of accuracy.json

Rendering them (Markdown, HTML, plots) is `reports`.
"""
