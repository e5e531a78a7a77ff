#!/usr/bin/env node
// A client of the RAG-R1 retriever in Node.js, built from the contracts in proto/ alone: no code of the
// project, no generated files. @grpc/proto-loader reads retriever.proto (and the common.proto it
// imports) at start; @grpc/grpc-js makes the call.
//
//   npm ci
//   node search.js 127.0.0.1:50051 "who wrote hamlet" "hamlet author"
//   node search.js --top-k 5 --json 127.0.0.1:50051 "who wrote hamlet"
//
// Options: --top-k N (passages per query, default 3), --timeout S (the call's deadline, default 30),
// --json (the reply as JSON on one line), --proto DIR (the proto/ folder; default: the repository's,
// two levels up), --token T (a bearer token, when the retriever has auth on; also RAGR1_TOKEN),
// --ca FILE (the server's CA: TLS on). A failed call prints one line naming the method, the status and
// the service's message, and exits with 1.
'use strict';

const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE = 'usage: node search.js [--top-k N] [--timeout S] [--json] [--proto DIR] [--token T] [--ca FILE] ADDRESS QUERY...';

function parseArgs(argv) {
  const opts = {
    topK: 3,
    timeout: 30,
    json: false,
    proto: path.join(__dirname, '..', '..', 'proto'),
    token: process.env.RAGR1_TOKEN || '',
    ca: '',
    rest: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--top-k') opts.topK = Number(value());
    else if (arg === '--timeout') opts.timeout = Number(value());
    else if (arg === '--json') opts.json = true;
    else if (arg === '--proto') opts.proto = value();
    else if (arg === '--token') opts.token = value();
    else if (arg === '--ca') opts.ca = value();
    else if (arg === '-h' || arg === '--help') opts.help = true;
    else opts.rest.push(arg);
  }
  if (!Number.isInteger(opts.topK) || opts.topK < 1) throw new Error(`--top-k must be a positive integer, got ${opts.topK}`);
  if (!(opts.timeout > 0)) throw new Error(`--timeout must be a positive number of seconds, got ${opts.timeout}`);
  return opts;
}

function retrieverService(protoDir) {
  const file = path.join(protoDir, 'ragr1', 'v1', 'retriever.proto');
  if (!fs.existsSync(file)) throw new Error(`${file} not found: give the proto/ folder with --proto`);
  const definition = protoLoader.loadSync(file, {
    includeDirs: [protoDir],
    keepCase: true, // field names as in the .proto (top_k, num_shards)
    longs: Number,
    defaults: true,
  });
  return grpc.loadPackageDefinition(definition).ragr1.v1.Retriever;
}

function credentials(opts) {
  if (!opts.ca) {
    if (opts.token) console.error('warning: sending a bearer token without TLS');
    return grpc.credentials.createInsecure();
  }
  const channel = grpc.credentials.createSsl(fs.readFileSync(opts.ca));
  if (!opts.token) return channel;
  const bearer = grpc.credentials.createFromMetadataGenerator((_, done) => {
    const metadata = new grpc.Metadata();
    metadata.set('authorization', `Bearer ${opts.token}`);
    done(null, metadata);
  });
  return grpc.credentials.combineChannelCredentials(channel, bearer);
}

function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`search.js: ${err.message}\n${USAGE}`);
    return process.exit(2);
  }
  if (opts.help || opts.rest.length < 2) {
    console.error(USAGE);
    return process.exit(opts.help ? 0 : 2);
  }
  const [address, ...queries] = opts.rest;
  const Retriever = retrieverService(opts.proto);
  const client = new Retriever(address, credentials(opts));
  const metadata = new grpc.Metadata();
  if (opts.token && !opts.ca) metadata.set('authorization', `Bearer ${opts.token}`);
  const deadline = new Date(Date.now() + opts.timeout * 1000);
  client.Search({ queries, top_k: opts.topK }, metadata, { deadline }, (err, reply) => {
    client.close();
    if (err) {
      const message = String(err.details).replace(/\s+/g, ' ').trim();
      console.error(`ragr1.v1.Retriever/Search at ${address}: ${grpc.status[err.code]}: ${message}`);
      return process.exit(1);
    }
    if (opts.json) {
      console.log(JSON.stringify(reply));
      return;
    }
    reply.results.forEach((result, i) => {
      console.log(`${queries[i]}`);
      result.passages.forEach((p, rank) => {
        const text = p.text.length > 200 ? `${p.text.slice(0, 200)}...` : p.text;
        console.log(`  ${rank + 1}. ${p.title} [${p.id}] score ${p.score.toFixed(3)}`);
        if (text) console.log(`     ${text}`);
      });
    });
    if (reply.partial) console.log(`(partial: shards ${reply.missing_shards.join(', ')} did not answer)`);
  });
}

main();
