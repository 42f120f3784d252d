"""`sim vet` and what follows it: the scorecard, the forecast at scale and its check."""
