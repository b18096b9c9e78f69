package nft

// SetBeforeBatch sets the hook between Apply's look and its batch.
func SetBeforeBatch(f func()) { beforeBatch = f }
