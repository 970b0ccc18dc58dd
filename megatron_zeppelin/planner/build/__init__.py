"""Building and checking a Plan: a strategy's Placement assembled (assemble) into layouts (layout),
the remap (remap, levels), the ring schedule (schedule) routed over the NICs (routing), and the
Plan's invariants (checks). A regular package: find_packages, and so a wheel, leaves out a folder
without this file."""
