"""A conversion job and its phases: the spec (spec.py), the plan written from it, the work
folder, the units' status, and the merge that turns finished units into shards."""
