"""What a conversion reads: input files found and opened, their records, and the work units
they are cut into."""
