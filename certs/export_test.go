package certs

// RenewAtWith exposes renewAt with a fixed random draw u in [0,1).
var RenewAtWith = renewAt
