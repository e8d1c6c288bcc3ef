"""Synthetic scenes with exact truth: shapes on backgrounds (`synthetic`), clips whose objects
cross known lines and zones (`counting`), writers of datasets and clips (`writers`) and the
bundled sample clip's truth with the recall scoring against it (`clip_truth`)."""
