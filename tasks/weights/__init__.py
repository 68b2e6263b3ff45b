"""The weights stage: the weights file a program runs with, from a checkpoint or the seeded init,
made apart from the program so that a new checkpoint reruns nothing else."""
