"""What travels between this machine and a host: images out (only the layers a host lacks, by a transport
chosen from one table), datasets and code snapshots out by content, a run's outputs back, verified."""
