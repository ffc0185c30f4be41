"""On-disk forms: checksummed section containers (.difir, .difplan), text form, .diftensor."""
