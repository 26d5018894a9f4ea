"""The one scheduling core both worlds drive (the simulator and the daemon): plain values, policies,
the scheduler, the world model and their rules. Pure: no clock, no I/O but reading its packaged data;
imports only common."""
