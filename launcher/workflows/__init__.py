"""Running and verifying together, above both: an experiment's replicate groups spread over hosts, two runs
executed again to find where they part (diverge), and a bundle's run repeated and judged (reproduce)."""
