"""A conversion worker process: what happens to one work unit, read, tokenized and persisted in
the work folder."""
