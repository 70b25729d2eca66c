"""The builtin target's synthetic token process, in Python, id for id (worker/builtin/model.cc TokenChain): a
fixed random Markov chain over 64 of the vocabulary's ids (never vocab-1, the drafter's mask token); from each
token it goes to its fixed successor with probability 0.9, else to a random state. Low entropy, so a drafter
learns it and its loss falls (uniform random ids cannot be learnt: the loss stays at log(vocab)). The chain is the
seed's; a sample's walk is a function of (seed, producer rank, sample number), so a restarted target republishes
the same samples. dflash_launch.roles.hf_target uses it when no --tokens file is given; tests/test_builtin.py checks it
against `dflash-builtin tap`."""

_MASK = (1 << 64) - 1


def _splitmix(state):
    """SplitMix64: (the next state, its output), as the C++ SplitMix."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


class TokenChain:
    def __init__(self, seed, vocab):
        self.seed = seed & _MASK
        usable = vocab - 1  # vocab-1 is the drafter's mask token
        ids = list(range(usable))
        s = self.seed ^ 0x5EEDC4A100000001
        for i in range(len(ids), 1, -1):
            s, r = _splitmix(s)
            j = r % i
            ids[i - 1], ids[j] = ids[j], ids[i - 1]
        self.states = ids[:min(64, usable)]
        nxt = list(self.states)
        for i in range(len(nxt), 1, -1):
            s, r = _splitmix(s)
            j = r % i
            nxt[i - 1], nxt[j] = nxt[j], nxt[i - 1]
        self.successor = dict(zip(self.states, nxt))

    def sample(self, rank, seq, n):
        """`n` token ids of sample (rank, seq)."""
        s = ((self.seed * 0x9E3779B97F4A7C15) ^ ((rank + 1) * 0xC2B2AE3D27D4EB4F) ^
             ((seq + 1) * 0x165667B19E3779F9)) & _MASK
        s, r = _splitmix(s)
        t = self.states[r % len(self.states)]
        out = [t]
        for _ in range(1, n):
            s, r = _splitmix(s)
            if (r >> 11) * 2.0 ** -53 < 0.9:
                t = self.successor[t]
            else:
                s, r = _splitmix(s)
                t = self.states[r % len(self.states)]
            out.append(t)
        return out
