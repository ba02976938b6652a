"""Claiming: what a dispatcher leases and when. The claimer, the claim policy of each queue
(plain, queue slots, key slots, fair turns, aged), the turns across keys, the jobs it holds
(claimed ahead, running, finishing) and the insert hints that announce new work."""
