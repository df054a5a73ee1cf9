"""Proof that travels: signed in-toto statements of runs, bundles, and independent re-execution.

- :mod:`statement`: the in-toto Statement v1 envelope's content, its subjects and schema checks;
- :mod:`provenance`: a run's SLSA Provenance v1 statement, from what launcher recorded (`launcher attest`);
- :mod:`dsse`: the DSSE envelope (PAE, sign, verify against trusted keys);
- :mod:`signers`: keys people already have (an SSH key through ssh-keygen -Y, a PEM key through
  cryptography) and what a verifier trusts (an allowed-signers file, a public key);
- :mod:`check`: `launcher attest verify`: signature, schema and, given a run folder, every digest;
- :mod:`bundle`: `launcher bundle`: a deterministic tar of what it takes to rebuild and rerun;
- :mod:`tarread`, :mod:`unpack`, :mod:`deps`: a bundle read as a stranger's file (headers first, the envelope
  verified before anything is written, only the files it names extracted) and held against each run's
  provenance;
- :mod:`summary`: the signed verification summary (SLSA VSA v1) of a reproduction; `launcher reproduce` itself,
  which checks the bundle, rebuilds the image, repeats the run and compares, is
  :mod:`launcher.workflows.reproduce` (it runs and verifies, above both).
"""
