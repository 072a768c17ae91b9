"""What a worker session runs on a segment: sub-epochs and validation passes (`worker`),
the models it holds (`models`), staged features (`features`), inference (`inference`), and,
on a segment server, packing its own rows (`pack`)."""
