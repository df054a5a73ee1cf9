"""A run's records: the typed documents of a run folder (launch record, manifest, pull state, the runtime's
exit and code records), the folder's layout and each record's one reader and writer, finding runs by id, and
a run's files checked against its manifest. Below the run stage and verify, which both read them."""
