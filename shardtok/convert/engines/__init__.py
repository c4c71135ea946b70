"""Who runs a job's phases: the one-command local run, a rank of many (run-units, for Slurm
arrays or any scheduler), and a dask cluster."""
