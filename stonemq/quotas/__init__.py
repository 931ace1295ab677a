"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546): quota entities and their
validation, the sampled rate and throttle-time math, and the broker's quota manager."""
