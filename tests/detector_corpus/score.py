import sys
# stdin: measure output; argv[1]: attack|benign
kind=sys.argv[1]
tot=0; caught=0; rows=[]
for line in sys.stdin:
    p=line.rstrip('\n').split('\t',3)
    if len(p)<4: continue
    ln,fam,codes,text=p
    cs=[c for c in codes.split(',') if c]
    hit=any(c.startswith('prompt_injection') or c.startswith('secret_') or c=='source_laundering' for c in cs)
    tot+=1; caught+=hit
    if (kind=='attack' and not hit) or (kind=='benign' and hit):
        rows.append(f"{ln} [{fam}] {codes} :: {text}")
print(f"{kind}: flagged {caught}/{tot}")
for r in rows: print("  ",r)
