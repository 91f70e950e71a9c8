"""The Redis engine (internal): ``SharedDict(name, backend="redis://...")``,
under the protocol of :mod:`ultradict_ng._redis.layout`."""
