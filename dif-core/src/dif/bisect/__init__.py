"""First-divergence search between dif's captures and an oracle (`dif bisect`): the metrics and bars
(`dif.bisect.metrics`), the ordered report (`dif.bisect.report`), capture files and the oracle-fixture
manifest protocol (`dif.bisect.fixtures`)."""
