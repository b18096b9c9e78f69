package server

import (
	"context"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/hashicorp/go-hclog"
)

// InterceptorLogger adapts an hclog logger to go-grpc-middleware's logging
// interceptors. Their fields are already flat key/value pairs, which is
// what hclog takes.
func InterceptorLogger(l hclog.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(hclogLevel(lvl), msg, fields...)
	})
}

func hclogLevel(lvl logging.Level) hclog.Level {
	switch {
	case lvl <= logging.LevelDebug:
		return hclog.Debug
	case lvl <= logging.LevelInfo:
		return hclog.Info
	case lvl <= logging.LevelWarn:
		return hclog.Warn
	default:
		return hclog.Error
	}
}
