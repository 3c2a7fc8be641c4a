"""Curation: filters, deduplication, rejection sampling, splits and augmentation of trajectory stores."""
