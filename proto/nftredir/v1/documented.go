package nftredirv1

import (
	_ "embed"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// The generated code carries the API's descriptors without their comments.
// nftredir.binpb is the same API built by buf with source info kept (make
// proto writes it), so server reflection can show grpcurl users the
// documentation along with the shapes.
//
//go:embed nftredir.binpb
var documentedSet []byte

var documented = sync.OnceValues(func() (*protoregistry.Files, error) {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(documentedSet, &set); err != nil {
		return nil, fmt.Errorf("decode embedded API descriptors: %w", err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("load embedded API descriptors: %w", err)
	}
	return files, nil
})

// DocumentedResolver resolves descriptors from the commented copy of this
// API first and from everything linked into the program after, so
// reflection also serves health and reflection's own services.
func DocumentedResolver() (protodesc.Resolver, error) {
	files, err := documented()
	if err != nil {
		return nil, err
	}
	return chain{files, protoregistry.GlobalFiles}, nil
}

type chain []*protoregistry.Files

func (c chain) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	for _, f := range c {
		if d, err := f.FindFileByPath(path); err == nil {
			return d, nil
		}
	}
	return nil, protoregistry.NotFound
}

func (c chain) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	for _, f := range c {
		if d, err := f.FindDescriptorByName(name); err == nil {
			return d, nil
		}
	}
	return nil, protoregistry.NotFound
}
